"""WebShop with the single-turn prompt style: fresh prompt per step, <action> extraction, per-turn scoring."""

import torch

from empo2.envs.webshop import WebShopEnv
from empo2.episode import PLAIN
from empo2.llm.logprobs import episode_logprobs, tokens_processed
from empo2.method.rollout import Roller
from empo2.prompts import extract_action


def test_single_turn_rollout_on_webshop(policy_and_tokenizer):
    model, tokenizer = policy_and_tokenizer
    envs = [WebShopEnv(max_steps=3, snap_actions=True) for _ in range(2)]
    roller = Roller(model, tokenizer, env_name="webshop", response_tokens=16, tip_tokens=8,
                    prompt_style="single_turn", history_turns=1, sampling_rng=torch.Generator().manual_seed(0))
    variation = envs[0].train_variations[0]
    episodes = roller.run(envs, [variation] * 2, [PLAIN] * 2, temperature=1.0, write_tips=True)
    assert roller.last_generator.reuse_cache is False  # prompts are rewritten every step
    for episode in episodes:
        assert episode.tip and 1 <= len(episode.turns) <= 3
        first = tokenizer.decode(episode.turns[0].prompt_ids)
        assert "Admissible actions: [search[...]" in first and "<action>" in first
        for turn in episode.turns:
            assert turn.executed_action.startswith(("search[", "click["))
        if len(episode.turns) > 1:
            second = tokenizer.decode(episode.turns[1].prompt_ids)
            assert "Your last 1 action(s)" in second and not second.startswith(first[:-20])
            # Not append-only: the packed path falls back to one pass per turn.
            assert tokens_processed(episode, with_tips=False, packed=True) == tokens_processed(
                episode, with_tips=False, packed=False)
        with torch.no_grad():
            logprobs = episode_logprobs(model, episode, with_tips=False)
        assert logprobs.shape[0] == sum(len(t.response_ids) for t in episode.turns)
        assert torch.isfinite(logprobs).all()
    for env in envs:
        env.close()


def test_extract_action():
    assert extract_action("<think>the red one</think>\n<action>click[red]</action>") == "click[red]"
    assert extract_action("<action>search[a]</action> <action>click[b]") == "click[b]"
    assert extract_action("click[buy now]") == "click[buy now]"


def test_snapping_searches_for_free_text_on_the_search_page():
    env = WebShopEnv(snap_actions=True)
    env.reset(env.train_variations[0])
    result = env.step("I would like some red shoes please")
    assert result.info["executed_action"] == "search[I would like some red shoes please]"
    assert not result.info["invalid"] and result.info["page"] == "results"


def test_snapping_on_the_results_page_matches_a_product_by_its_title():
    env = WebShopEnv(snap_actions=True)
    env.reset(env.train_variations[0])
    env.step("search[shirt]")
    asin = env._results[1]
    title = env.product_by_asin[asin]["Title"]
    result = env.step(f"I pick the {title}")
    assert result.info["executed_action"] == f"click[{asin.lower()}]" and result.info["page"] == "item"


def test_out_of_distribution_adaptation_runs_on_webshop():
    """Adaptation builds its environments and roller from the config, so WebShop's own settings reach them."""
    from empo2.method.adaptation import adapt
    from empo2.config import EMPO2Config

    cfg = EMPO2Config.from_profile("ci", env="webshop", max_steps=2, response_tokens=8, tip_tokens=8)
    rows = adapt(cfg, None, "webshop", trials=2, episodes_per_trial=2)
    assert list(rows["trial"]) == [1, 1, 2, 2]
    assert rows["tip"].str.len().gt(0).all()  # every episode wrote a tip for the next trial
    assert rows.loc[rows["trial"] == 2, "tips_shown"].sum() > 0  # and the second trial was shown them
