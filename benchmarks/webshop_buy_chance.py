"""How often the untrained policy would buy: its chance of choosing `click[buy now]` on an item's page.

    python benchmarks/webshop_buy_chance.py [--goals 6]

For each of the first training goals: search with some of the goal's words, open the first product, then
score every admissible action under the untrained SmolLM2-135M (each action's log-probability as one
sequence, renormalised over the admissible ones: the constrained policy's choice at temperature 1, up to
the per-token renormalisation of the trie). Printed for the item page as WebShop lists it and as
`WebShopEnv(buy_first=True)` lists it (buy now first, the first turn saying what it buys), and once more
after the policy has clicked an option; the ratio is buy_first's chance over the page order's.
"""

from __future__ import annotations

import argparse

import torch

from empo2.config import EMPO2Config
from empo2.envs.webshop import BACK_TO_SEARCH, BUY_NOW, PREV_PAGE, SUB_PAGES, WebShopEnv
from empo2.llm.models import load_policy
from empo2.prompts import SYSTEM_PROMPT

NAVIGATION = {f"click[{button}]" for button in (BUY_NOW, BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES)}
"""An item page's buttons that are not product options."""


def choice_probabilities(model, tokenizer, messages: list[dict], actions: list[str]) -> dict[str, float]:
    """Each admissible action's probability as the policy's next reply, renormalised over `actions`: the prompt
    is encoded once, then every action (ended with the end-of-turn token) is scored on a copy of its cache."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    action_ids = [ids + [tokenizer.eos_token_id] for ids in tokenizer(actions, add_special_tokens=False)["input_ids"]]
    longest = max(map(len, action_ids))
    padded = torch.tensor([ids + [tokenizer.eos_token_id] * (longest - len(ids)) for ids in action_ids])  # [A, L]
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        cache = out.past_key_values
        cache.batch_repeat_interleave(len(actions))
        mask = torch.ones(len(actions), len(prompt_ids) + longest, dtype=torch.long)
        later = model(padded, past_key_values=cache, attention_mask=mask).logits.float().log_softmax(-1)  # [A, L, V]
    first = out.logits[0, -1].float().log_softmax(-1)  # [V]: the first token of each action
    logprobs = torch.stack([first[ids[0]] + sum(later[a, j - 1, ids[j]] for j in range(1, len(ids)))
                            for a, ids in enumerate(action_ids)])  # [A]
    return dict(zip(actions, logprobs.softmax(0).tolist()))


def buy_chances(env: WebShopEnv, model, tokenizer, goals: int, after_option: bool) -> list[float]:
    chances = []
    for variation in env.train_variations[:goals]:
        observation, info = env.reset(variation)
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": env.first_turn_text(info["task_description"], observation, info)}]
        choose = [lambda actions: "search[" + " ".join(info["query_words"][2:8]) + "]",
                  lambda actions: next(a for a in actions if a.startswith("click[b0"))]
        if after_option:
            choose.append(lambda actions: next(a for a in actions if a not in NAVIGATION))
        for step, pick in enumerate(choose, start=2):
            action = pick(info["valid_actions"])
            result = env.step(action)
            info = result.info
            messages += [{"role": "assistant", "content": action},
                         {"role": "user", "content": env.next_turn_text(result.observation, info, step, env.max_steps)}]
        chances.append(choice_probabilities(model, tokenizer, messages, info["valid_actions"])["click[buy now]"])
    return chances


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goals", type=int, default=6)
    args = parser.parse_args()
    model, tokenizer = load_policy()
    model.eval()
    env = WebShopEnv.from_config(EMPO2Config.from_profile("laptop", env="webshop", webshop_query="words"))
    rows = {}
    for buy_first in (False, True):
        env.buy_first = buy_first
        for after_option in (False, True):
            rows[buy_first, after_option] = buy_chances(env, model, tokenizer, args.goals, after_option)
    for after_option, where in ((False, "first item page"), (True, "after clicking an option")):
        page, first = (sum(rows[b, after_option]) / args.goals for b in (False, True))
        print(f"{where}: buy now {100 * page:.1f}% as the page reads, {100 * first:.1f}% with buy_first "
              f"(ratio {first / page:.1f}), mean of {args.goals} training goals")


if __name__ == "__main__":
    main()
