"""Group rollouts with tips, turn records, and packed vs per-turn log-prob equality.

Uses the toy corridor world (fast, deterministic) with the real default model.
"""

import numpy as np
import pytest
import torch

from empo2.envs.toy import CorridorEnv
from empo2.episode import MEMORY_ON_POLICY, OFF_POLICY, PLAIN
from empo2.llm.logprobs import episode_logprobs, tokens_processed
from empo2.method.loss import policy_loss
from empo2.method.memory import TipMemory
from empo2.method.rollout import Roller, draw_modes


def test_draw_modes_frequencies():
    rng = np.random.default_rng(0)
    modes = np.array(draw_modes(20000, 0.25, 2 / 3, rng))
    assert abs((modes != PLAIN).mean() - 0.25) < 0.02
    assert abs((modes == OFF_POLICY).sum() / (modes != PLAIN).sum() - 2 / 3) < 0.03
    assert set(draw_modes(8, 0.0, 0.5, rng)) == {PLAIN}
    per_iteration = draw_modes(8, 0.5, 0.5, np.random.default_rng(3), per_iteration=True)
    assert len(set(per_iteration)) == 1 and len(per_iteration) == 8


@pytest.fixture(scope="module")
def memory_episodes(policy_fp32, embedder):
    model, tokenizer = policy_fp32
    memory = TipMemory(dim=384, similarity_threshold=0.3, top_k=2)
    env = CorridorEnv(max_steps=3)
    states = []
    for variation in (0,):
        _, info = env.reset(variation)
        states.append(info["state_text"])
    keys = embedder.encode(states * 3)
    memory.add_many(keys, [f"tip number {i}: go east first." for i in range(3)], [10.0, 20.0, 30.0],
                    ["corridor:0"] * 3)
    roller = Roller(model, tokenizer, env_name="corridor", response_tokens=8, tip_tokens=8, embedder=embedder,
                    memory=memory, sampling_rng=torch.Generator().manual_seed(0))
    envs = [CorridorEnv(max_steps=3) for _ in range(3)]
    episodes = roller.run(envs, [0, 0, 0], [PLAIN, MEMORY_ON_POLICY, OFF_POLICY], temperature=1.0, write_tips=True)
    return model, tokenizer, episodes, roller


def test_memory_episodes_see_tips_and_records_are_consistent(memory_episodes):
    _, tokenizer, episodes, roller = memory_episodes
    plain, memory_on, off_policy = episodes
    assert all(not turn.tips_shown for turn in plain.turns)
    assert memory_on.turns[0].tips_shown and off_policy.turns[0].tips_shown
    assert memory_on.turns[0].tips_shown[0].startswith("tip number 2")  # best score first
    for episode in episodes:
        assert episode.tip  # every training episode wrote a tip
        for turn in episode.turns:
            assert len(turn.response_ids) == len(turn.behaviour_logprobs) > 0
            if turn.tips_shown:
                assert len(turn.prompt_ids) > len(turn.prompt_ids_tip_free)
                assert "<tip>" in tokenizer.decode(turn.prompt_ids)
                assert "<tip>" not in tokenizer.decode(turn.prompt_ids_tip_free)
            else:
                assert turn.prompt_ids == turn.prompt_ids_tip_free
    added = roller.store_tips(episodes)
    assert added > 0 and len(roller.memory) == 3 + added


def test_packed_and_per_turn_logprobs_and_loss_agree(memory_episodes):
    model, _, episodes, _ = memory_episodes
    multi_turn = [e for e in episodes if len(e.turns) > 1]
    assert multi_turn, "need at least one multi-turn episode"
    with torch.no_grad():
        for episode in episodes:
            for with_tips in (True, False):
                packed = episode_logprobs(model, episode, with_tips=with_tips, packed=True)
                per_turn = episode_logprobs(model, episode, with_tips=with_tips, packed=False)
                torch.testing.assert_close(packed, per_turn, atol=1e-4, rtol=0)
                if len(episode.turns) > 1:
                    assert tokens_processed(episode, with_tips=with_tips, packed=True) < tokens_processed(
                        episode, with_tips=with_tips, packed=False)
            # The behaviour log-probs recorded while sampling match the recomputed ones.
            recorded = torch.tensor([lp for turn in episode.turns for lp in turn.behaviour_logprobs])
            torch.testing.assert_close(episode_logprobs(model, episode, with_tips=True), recorded, atol=1e-4, rtol=0)

    off_policy = episodes[2]
    old = episode_logprobs(model, off_policy, with_tips=True).detach()
    sizes = [len(t.response_ids) for t in off_policy.turns]
    args = dict(advantages=torch.full((sum(sizes),), 1.5), token_mask=torch.ones(sum(sizes)),
                modes=torch.full((sum(sizes),), OFF_POLICY),
                sequence_ids=torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)))
    losses = []
    for packed in (True, False):
        new = episode_logprobs(model, off_policy, with_tips=False, packed=packed)
        loss, _ = policy_loss(new, old, **args)
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-4, rtol=0)


def test_backward_per_pass_gives_the_gradient_of_the_whole_episode_loss(memory_episodes):
    """One backward per forward pass (what non-append-only episodes use) equals one backward
    of the whole episode's loss, with KL, δ per sequence and a fixed normaliser."""
    from empo2.config import EMPO2Config
    from empo2.method.update import PolicyUpdate, TokenBatch

    model, _, episodes, _ = memory_episodes
    off_policy = episodes[2]
    assert len(off_policy.turns) > 1
    cfg = EMPO2Config.from_profile("ci", env="corridor", packed_logprobs=False, kl_beta=0.1, delta_mode="sequence",
                                   delta=0.5)
    with torch.no_grad():
        old = episode_logprobs(model, off_policy, with_tips=True) + 0.05  # (T,) ratios away from 1
        ref = episode_logprobs(model, off_policy, with_tips=False) - 0.05  # (T,)
    batch = TokenBatch.of(off_policy, -1.2, old_logprobs=old, ref_logprobs=ref)
    normalizer = 3.0 * len(old)
    params = [p for p in model.parameters() if p.requires_grad][-6:]
    model.zero_grad(set_to_none=True)
    whole = episode_logprobs(model, off_policy, with_tips=False, packed=False)
    loss, _ = policy_loss(whole, old, batch.advantages, batch.mask, batch.modes, batch.sequence_ids,
                          ref_logprobs=ref, kl_beta=cfg.kl_beta, delta=cfg.delta, delta_mode=cfg.delta_mode,
                          normalizer=normalizer)
    loss.backward()
    expected = [p.grad.clone() for p in params]
    model.zero_grad(set_to_none=True)
    new = PolicyUpdate(model, cfg, np.random.default_rng(0)).backward(off_policy, batch, normalizer)
    torch.testing.assert_close(new, whole.detach(), atol=1e-5, rtol=0)
    assert any(g.abs().max() > 0 for g in expected)
    for got, want in zip([p.grad for p in params], expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    model.zero_grad(set_to_none=True)


def test_repeat_tips_false_shows_each_tip_once_per_episode(policy_fp32, embedder):
    """Every corridor state is similar enough (threshold -1) to retrieve all tips at every step."""
    model, tokenizer = policy_fp32
    shown = {}
    for repeat in (True, False):
        memory = TipMemory(dim=384, similarity_threshold=-1.0, top_k=2)
        _, info = CorridorEnv().reset(0)
        memory.add_many(embedder.encode([info["state_text"]] * 3), [f"tip {i}: go east." for i in range(3)],
                        [10.0, 20.0, 30.0], ["corridor:0"] * 3)
        roller = Roller(model, tokenizer, env_name="corridor", response_tokens=8, tip_tokens=8, embedder=embedder,
                        memory=memory, sampling_rng=torch.Generator().manual_seed(0), repeat_tips=repeat)
        episodes = roller.run([CorridorEnv(max_steps=3) for _ in range(4)], [0] * 4, [MEMORY_ON_POLICY] * 4,
                              temperature=1.0)
        shown[repeat] = [[turn.tips_shown for turn in e.turns] for e in episodes if len(e.turns) > 1]
        assert shown[repeat], "need an episode of more than one step"
    for turns in shown[True]:
        assert len(turns[0]) == 2 and all(tips == turns[0] for tips in turns)  # the same top 2 at every step
    for turns in shown[False]:
        assert len(turns[0]) == 2 and not any(turns[1:])  # already in the conversation: not shown again
