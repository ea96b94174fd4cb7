"""Constrained action decoding: the trie, real ScienceWorld rollouts, and sampler = update log-probs.

The rollout tests use the real ScienceWorld JVM and the real default model in
float32, so that "equal" can mean 1e-4 (see tests/test_generation.py).
"""

import pytest
import torch

from empo2.envs import make_env
from empo2.envs.webshop import WebShopEnv
from empo2.episode import MEMORY_ON_POLICY, OFF_POLICY, PLAIN
from empo2.llm.constrained import ActionEncoder
from empo2.llm.logprobs import episode_logprobs
from empo2.method.memory import TipMemory
from empo2.method.rollout import Roller


def test_trie_spells_exactly_the_admissible_actions(tokenizer):
    actions = ["look at door", "look at door to hallway", "open door", "go to kitchen"]
    encoder = ActionEncoder(tokenizer)
    constraint = encoder.constraint(actions)
    end = tokenizer.eos_token_id
    for action in actions:
        cursor = constraint.cursor()
        for token in [*encoder.encode([action])[0], end]:
            assert token in cursor.allowed()
            cursor.advance(token)
        assert cursor.done
    # "look at door" may end or go on: both the end-of-turn token and a continuation are allowed.
    cursor = constraint.cursor()
    for token in encoder.encode(["look at door"])[0]:
        cursor.advance(token)
    assert end in cursor.allowed() and len(cursor.allowed()) == 2 and cursor.forced() is None
    # A token that spells no admissible action is refused.
    with pytest.raises(ValueError, match="admissible"):
        constraint.cursor().advance(encoder.encode(["quit"])[0][0])
    # After "go", the rest of "go to kitchen" is forced, token by token.
    cursor = constraint.cursor()
    cursor.advance(encoder.encode(["go to kitchen"])[0][0])
    forced = []
    while not cursor.done and cursor.forced() is not None:
        forced.append(cursor.forced())
        cursor.advance(forced[-1])
    assert cursor.done and forced[-1] == end
    assert encoder.constraint(list(actions)) is constraint  # the same state's trie is built once


def test_free_text_template_takes_any_tokens_until_the_closing_bracket(tokenizer):
    encoder = ActionEncoder(tokenizer)
    constraint = encoder.constraint(["search[...]"], free_text_tokens=20)
    cursor = constraint.cursor()
    prefix = []
    while cursor.forced() is not None:  # "search[" is forced
        prefix.append(cursor.forced())
        cursor.advance(prefix[-1])
    assert tokenizer.decode(prefix) == "search["
    assert cursor.allowed() is None  # free text: every token
    for token in tokenizer("red running shoes", add_special_tokens=False)["input_ids"]:
        cursor.advance(token)
        assert not cursor.done
    cursor.advance(tokenizer("]", add_special_tokens=False)["input_ids"][0])
    assert cursor.done


class RecordingEnv:
    """Wraps a real environment and checks that every action it is asked to execute is admissible."""

    def __init__(self, env):
        self.env, self.admissible, self.executed = env, [], []

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, variation):
        observation, info = self.env.reset(variation)
        self.admissible = info["valid_actions"]
        return observation, info

    def step(self, text):
        assert text in self.admissible, f"{text!r} is not admissible here"
        self.executed.append(text)
        result = self.env.step(text)
        self.admissible = result.info.get("valid_actions", [])
        return result


@pytest.fixture(scope="module")
def scienceworld_episodes(policy_fp32, embedder):
    model, tokenizer = policy_fp32
    envs = [RecordingEnv(make_env("scienceworld", "power-component", max_steps=4, n_test_variations=1))
            for _ in range(3)]
    try:
        variation = envs[0].train_variations[0]
        _, info = envs[0].reset(variation)
        memory = TipMemory(dim=384, similarity_threshold=0.3, top_k=2)
        memory.add_many(embedder.encode([info["state_text"]] * 2),
                        ["In a similar state you did 'go to hallway'. Tip: the workshop is off the hallway.",
                         "Tip: never focus on the orange."], [13.0, 7.0], [f"power-component:{variation}"] * 2)
        roller = Roller(model, tokenizer, env_name="scienceworld", response_tokens=8, tip_tokens=8,
                        embedder=embedder, memory=memory, action_decoding="constrained",
                        sampling_rng=torch.Generator().manual_seed(3))
        episodes = roller.run(envs, [variation] * 3, [PLAIN, MEMORY_ON_POLICY, OFF_POLICY], temperature=1.0)
        yield model, tokenizer, episodes, envs, roller
    finally:
        for env in envs:
            env.close()


def test_every_sampled_action_is_admissible(scienceworld_episodes):
    _, _, episodes, envs, roller = scienceworld_episodes
    assert sum(len(env.executed) for env in envs) == sum(len(e.turns) for e in episodes) >= 3
    for episode in episodes:
        for turn in episode.turns:
            assert turn.raw_action == turn.executed_action  # nothing was snapped
            assert len(turn.response_allowed) == len(turn.response_ids)
    # Runs of forced tokens are fed in one forward pass: fewer model calls than sampled tokens.
    longest = max(len(t.response_ids) for e in episodes for t in e.turns)
    assert roller.last_generator.forward_calls < sum(len(e.turns) for e in episodes) * longest


def test_sampler_logprobs_equal_the_updates_constrained_logprobs(scienceworld_episodes):
    model, _, episodes, _, _ = scienceworld_episodes
    assert any(turn.tips_shown for turn in episodes[1].turns + episodes[2].turns)
    with torch.no_grad():
        for episode in episodes:
            recorded = torch.tensor([lp for turn in episode.turns for lp in turn.behaviour_logprobs])
            # Behaviour context: with tips for memory episodes, tip-free for the plain one.
            packed = episode_logprobs(model, episode, with_tips=episode.mode != PLAIN, packed=True)
            torch.testing.assert_close(packed, recorded, atol=1e-4, rtol=0)
            per_turn = episode_logprobs(model, episode, with_tips=episode.mode != PLAIN, packed=False)
            torch.testing.assert_close(per_turn, recorded, atol=1e-4, rtol=0)
        # Tip-free scoring of a tip-guided episode (the off-policy update) is renormalised the same way.
        off_policy = episodes[2]
        tip_free = episode_logprobs(model, off_policy, with_tips=False)
        assert (tip_free <= 1e-6).all() and torch.isfinite(tip_free).all()


def test_sampler_entropies_are_the_renormalised_distributions_entropies(scienceworld_episodes):
    """The entropy recorded at each sampled token is that of the distribution it was drawn from: the policy's
    next-token distribution over the allowed ids, renormalised, recomputed here from one full forward pass."""
    model, _, episodes, _, _ = scienceworld_episodes
    with torch.no_grad():
        for episode in episodes:
            turn = episode.turns[-1]  # the last turn's prompt holds every earlier turn (append-only)
            prompt = turn.prompt_ids if episode.mode != PLAIN else turn.prompt_ids_tip_free
            ids = prompt + turn.response_ids
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # (L, vocab)
            position = len(ids) - len(turn.response_ids)
            for k, allowed in enumerate(turn.response_allowed):
                logprobs = logits[position + k - 1, list(allowed)].log_softmax(-1)  # (k,)
                expected = float(-(logprobs.exp() * logprobs).sum())
                assert abs(turn.behaviour_entropies[k] - expected) < 1e-4
        decided = [e.decision_entropy() for e in episodes]
        assert all(value is not None and value > 0 for value in decided)


def test_a_forced_position_contributes_zero(scienceworld_episodes):
    from empo2.method.update import TokenBatch

    model, _, episodes, _, _ = scienceworld_episodes
    episode = episodes[0]
    allowed = [a for turn in episode.turns for a in turn.response_allowed]
    forced = torch.tensor([len(a) == 1 for a in allowed])  # (T,)
    assert forced.any() and (~forced).any()
    logprobs = episode_logprobs(model, episode, with_tips=False)  # (T,), with grad
    assert (logprobs[forced] == 0).all()
    recorded = torch.tensor([lp for turn in episode.turns for lp in turn.behaviour_logprobs])
    assert (recorded[forced] == 0).all()
    logprobs[forced].sum().backward()  # no path from a forced position to the weights
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in model.parameters())
    model.zero_grad(set_to_none=True)
    assert torch.equal(TokenBatch.of(episode, 1.0).mask, (~forced).float())
    assert episode.decision_count() == int((~forced).sum())


def test_webshop_search_keeps_free_query_text(policy_and_tokenizer):
    model, tokenizer = policy_and_tokenizer
    envs = [RecordingEnv(WebShopEnv(max_steps=3)) for _ in range(2)]
    # Free-text arguments are not in the admissible list; the template is.
    for env in envs:
        env.step = _webshop_step(env)
    roller = Roller(model, tokenizer, env_name="webshop", response_tokens=12, tip_tokens=8,
                    action_decoding="constrained", sampling_rng=torch.Generator().manual_seed(0))
    episodes = roller.run(envs, [envs[0].train_variations[0]] * 2, [PLAIN] * 2, temperature=1.0)
    for episode in episodes:
        assert episode.turns[0].executed_action.startswith("search[")  # the search page admits only search
        for turn in episode.turns:
            if turn.executed_action.startswith("search["):
                assert turn.executed_action.endswith("]") and turn.executed_action[len("search["):-1].strip()
                free = [a is None for a in turn.response_allowed]
                assert any(free)  # the query's tokens were the policy's free choice
                assert tokenizer.decode(turn.response_ids).startswith(turn.executed_action[:-1])
            else:
                assert turn.executed_action.startswith("click[")
    for env in envs:
        env.close()


def _webshop_step(env):
    def step(text):
        if text.startswith("search["):
            assert "search[...]" in env.admissible
        else:
            assert text in env.admissible, f"{text!r} is not admissible here"
        result = env.env.step(text)
        env.admissible = result.info.get("valid_actions", [])
        return result
    return step
