"""WebShop's constrained query (`webshop_query="words"`): the policy searches with words of its goal only,
chosen one at a time from its renormalised probabilities; sampler and update log-probs agree on them."""

import random
import re

import pytest
import torch

from empo2.config import EMPO2Config
from empo2.envs.webshop import WebShopEnv
from empo2.envs.webshop_data import instruction_words
from empo2.episode import MEMORY_ON_POLICY, OFF_POLICY, PLAIN
from empo2.llm.constrained import ActionEncoder, action_text
from empo2.llm.logprobs import episode_logprobs
from empo2.method.memory import TipMemory
from empo2.method.rollout import Roller

QUERY = re.compile(r"search\[(.+)\]")


def test_a_word_loop_spells_queries_of_the_allowed_words_only(tokenizer):
    words = ["white", "hoodie", "3x-large", "3x", "men's"]
    encoder = ActionEncoder(tokenizer)
    constraint = encoder.constraint(["search[...]"], 12, words=words)
    close = encoder.encode(["]"])[0][0]
    rng = random.Random(0)
    lengths = set()
    for _ in range(200):  # random walks through the constraint
        cursor, ids = constraint.cursor(), []
        while not cursor.done:
            allowed = cursor.allowed()
            if len(ids) == len(encoder.encode(["search["])[0]):
                assert close not in allowed  # a query has at least one word
            ids.append(rng.choice(allowed))
            cursor.advance(ids[-1])
        match = QUERY.fullmatch(action_text(tokenizer.decode(ids)))
        assert match and set(match[1].split(" ")) <= set(words), tokenizer.decode(ids)
        lengths.add(len(match[1].split(" ")))
    assert len(lengths) > 2  # the policy chooses how many words, too
    with pytest.raises(ValueError, match="allowed words"):
        cursor = constraint.cursor()
        for token in encoder.encode(["search[black"])[0]:
            cursor.advance(token)


def test_instruction_words_are_the_goals_words():
    assert instruction_words("I need a White hoodie, in 3X-large (men's), and price lower than 40.00 dollars") == [
        "i", "need", "a", "white", "hoodie", "in", "3x-large", "men's", "and", "price", "lower", "than", "40.00",
        "dollars"]


def test_the_prompt_shows_no_placeholder_query_and_the_config_needs_constrained_decoding():
    env = WebShopEnv(max_steps=3, query_words=True)
    observation, info = env.reset(env.train_variations[0])
    text = env.first_turn_text(info["task_description"], observation, info)
    assert "your query" not in text and info["query_words"] == instruction_words(info["task_description"])
    assert "your query" in WebShopEnv(max_steps=3).first_turn_text(info["task_description"], observation, info)
    with pytest.raises(ValueError, match="webshop_query: 'words' needs action_decoding 'constrained'"):
        EMPO2Config.from_profile("paper", env="webshop", webshop_query="words")
    assert EMPO2Config.from_profile("laptop", env="webshop", webshop_query="words").webshop_query == "words"
    assert EMPO2Config.from_profile("ci", env="webshop").webshop_query == "words"
    assert EMPO2Config.from_profile("paper", env="webshop").webshop_query == "free"


def test_constrained_queries_are_goal_words_and_score_alike_in_sampler_and_update(policy_fp32, embedder):
    model, tokenizer = policy_fp32
    envs = [WebShopEnv(max_steps=3, query_words=True) for _ in range(3)]
    variation = envs[0].train_variations[0]
    _, info = envs[0].reset(variation)
    memory = TipMemory(dim=384, similarity_threshold=0.0, top_k=1)
    memory.add_many(embedder.encode([info["state_text"]]), ["In a similar state you did 'search[hoodie]'."],
                    [50.0], [f"webshop:{variation}"])
    roller = Roller(model, tokenizer, env_name="webshop", response_tokens=12, tip_tokens=8, embedder=embedder,
                    memory=memory, action_decoding="constrained", sampling_rng=torch.Generator().manual_seed(1))
    episodes = roller.run(envs, [variation] * 3, [PLAIN, MEMORY_ON_POLICY, OFF_POLICY], temperature=1.0)
    goal_words = set(info["query_words"])
    searches = [t for e in episodes for t in e.turns if t.executed_action.startswith("search[")]
    assert len(searches) >= 3 and any(e.turns[0].tips_shown for e in episodes[1:])
    for turn in searches:
        match = QUERY.fullmatch(turn.executed_action)
        assert match and set(match[1].split(" ")) <= goal_words, turn.executed_action
        assert all(allowed is not None for allowed in turn.response_allowed)  # no free-text position
    with torch.no_grad():
        for episode in episodes:
            recorded = torch.tensor([lp for turn in episode.turns for lp in turn.behaviour_logprobs])
            scored = episode_logprobs(model, episode, with_tips=episode.mode != PLAIN)
            torch.testing.assert_close(scored, recorded, atol=1e-4, rtol=0)
        tip_free = episode_logprobs(model, episodes[2], with_tips=False)  # the off-policy update's context
        assert torch.isfinite(tip_free).all() and (tip_free <= 1e-6).all()


def test_the_small_policy_interface_lists_buy_now_first_and_says_what_it_does():
    """From the config: words queries come with buy_first; the paper's free query keeps the page's order."""
    small = WebShopEnv.from_config(EMPO2Config.from_profile("ci", env="webshop"))
    paper = WebShopEnv.from_config(EMPO2Config.from_profile("laptop", env="webshop", webshop_query="free"))
    pages = {}
    for name, env in (("small", small), ("paper", paper)):
        observation, info = env.reset(env.train_variations[0])
        text = env.first_turn_text(info["task_description"], observation, info)
        assert ("click[buy now] on an item's page buys it" in text) == (name == "small")
        words = [w for w in info["task_description"].lower().split() if w.isalpha()][2:6]
        result = env.step("search[" + " ".join(words) + "]")
        product = next(a for a in result.info["valid_actions"] if a.startswith("click[b0"))
        pages[name] = env.step(product).info["valid_actions"]
    assert pages["small"][0] == "click[buy now]" and pages["paper"][-1] == "click[buy now]"
    assert sorted(pages["small"]) == sorted(pages["paper"])
