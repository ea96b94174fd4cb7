"""Constrained tips: the template's trie, real ScienceWorld episodes' tips written by the real default policy,
sampled from its own renormalised probabilities, never cut, and stored in memory like any tip."""

import itertools
import re

import pytest
import torch

from empo2.chat import Message
from empo2.config import EMPO2Config
from empo2.envs import make_env
from empo2.episode import PLAIN
from empo2.llm.constrained import ActionEncoder, TemplateConstraint
from empo2.llm.generation import GroupGenerator
from empo2.llm.logprobs import sequence_logprobs
from empo2.method.memory import TipMemory
from empo2.method.rollout import Roller
from empo2.prompts import CONSTRAINED_TIP_PROMPT, constrained_tip_prompt, tip_template

TEMPLATE = re.compile(r"Helpful: (.+)\. Avoid: (.+)\. Next, try: (.+)\.")
BY_SCORE = re.compile(r"(Helpful|Avoid): (.+)\. Next, try: (.+)\.")


def test_a_template_spells_one_candidate_per_piece_and_nothing_else(tokenizer):
    pieces = [["Helpful:"], [" go to hall.", " go to hallway.", " open door."], [" Avoid:"], [" look.", " wait."]]
    encoder = ActionEncoder(tokenizer)
    template = TemplateConstraint(encoder, pieces)
    spelled, stack = set(), [[]]
    while stack:  # every path through the template, replayed from its start
        ids = stack.pop()
        cursor = template.cursor()
        for token in ids:
            cursor.advance(token)
        if cursor.done:
            spelled.add(tokenizer.decode(ids[:-1]))  # the end-of-turn token closes it
        else:
            stack += [[*ids, token] for token in cursor.allowed()]
    assert spelled == {"".join(choice) for choice in itertools.product(*pieces)}
    cursor = template.cursor()
    assert cursor.forced() is not None  # the literal "Helpful:" is forced, token by token
    with pytest.raises(ValueError, match="does not continue"):
        cursor.advance(encoder.encode([" Avoid"])[0][0])
    with pytest.raises(ValueError, match="every piece"):
        TemplateConstraint(encoder, [["Helpful:"], []])


def play_with_tips(model, tokenizer, embedder, template: str = "helpful_avoid_next"):
    """Two real power-component episodes (constrained actions, T = 1) with constrained tips; and the roller."""
    envs = [make_env("scienceworld", "power-component", max_steps=4, n_test_variations=1) for _ in range(2)]
    try:
        roller = Roller(model, tokenizer, env_name="scienceworld", response_tokens=8, tip_tokens=8,
                        embedder=embedder, memory=TipMemory(dim=384), action_decoding="constrained",
                        tip_decoding="constrained", tip_template=template, sampling_rng=torch.Generator().manual_seed(5))
        variation = envs[0].train_variations[0]
        return roller, roller.run(envs, [variation] * 2, [PLAIN] * 2, temperature=1.0, write_tips=True)
    finally:
        for env in envs:
            env.close()


@pytest.fixture(scope="module")
def tipped(policy_fp32, embedder):
    """The default template's tips of two real episodes."""
    model, tokenizer = policy_fp32
    roller, episodes = play_with_tips(model, tokenizer, embedder)
    return model, tokenizer, roller, episodes


def test_constrained_tips_stay_in_their_template_and_name_their_episode(tipped):
    _, tokenizer, _, episodes = tipped
    for episode in episodes:
        taken = {turn.executed_action for turn in episode.turns}
        match = TEMPLATE.fullmatch(episode.tip)
        assert match, episode.tip
        assert match[1] in taken and match[2] in taken and match[3] in episode.seen_actions
        assert tokenizer.decode(episode.tip_ids, skip_special_tokens=True).strip() == episode.tip
        # It ended by itself, past the 8 tokens a free tip of this roller may take: never cut.
        assert episode.tip_ids[-1] == tokenizer.eos_token_id and not episode.tip_cut
        assert len(episode.tip_ids) > 8


def test_a_constrained_tip_is_sampled_from_the_policys_renormalised_probabilities(tipped):
    model, tokenizer, roller, episodes = tipped
    episode = episodes[0]
    messages = [*episode.messages, Message("user", CONSTRAINED_TIP_PROMPT.format(score=episode.score))]
    prompt = roller.chat.render(messages, add_generation_prompt=True).ids()
    taken = list(dict.fromkeys(turn.executed_action for turn in episode.turns))
    template = TemplateConstraint(ActionEncoder(tokenizer), tip_template(taken, list(episode.seen_actions)))
    generator = GroupGenerator(model, tokenizer, 1, temperature=1.0, sampling_rng=torch.Generator().manual_seed(0))
    [response] = generator.generate({0: prompt}, 8, {0: template}).values()
    assert TEMPLATE.fullmatch(tokenizer.decode(response.ids, skip_special_tokens=True).strip())
    with torch.no_grad():
        scored = sequence_logprobs(model, prompt + response.ids, [(len(prompt), len(prompt) + len(response.ids))],
                                   allowed=response.allowed)
    torch.testing.assert_close(scored, torch.tensor(response.logprobs), atol=1e-4, rtol=0)
    chosen = [k for k, allowed in enumerate(response.allowed) if len(allowed) > 1]
    assert chosen and all(response.logprobs[k] == 0.0 for k in range(len(response.ids)) if k not in chosen)


def test_memory_entries_with_constrained_tips_round_trip(tipped, tmp_path):
    _, _, roller, episodes = tipped
    roller.memory = TipMemory(dim=384)
    added = roller.store_tips(episodes)
    assert added == len(roller.memory) > 0  # one entry per state acted in (repeated states once)
    roller.memory.save(tmp_path / "memory")
    loaded = TipMemory.load(tmp_path / "memory")
    entries = [(e.content, e.score, e.scope) for e in loaded.entries()]
    assert entries == [(e.content, e.score, e.scope) for e in roller.memory.entries()]
    assert all("Tip: Helpful: " in content for content, _, _ in entries)


def test_the_by_score_template_names_its_first_slot_after_the_score():
    taken, seen = ["open door to east", "look around"], ["open door to east", "look around", "move west"]
    assert tip_template(taken, seen, 100.0, "by_score") == [
        ["Helpful:"], [" open door to east.", " look around."], [" Next, try:"], [" move west."]]
    assert tip_template(taken, seen, 0.0, "by_score")[0] == ["Avoid:"]
    assert tip_template(taken, seen, -100.0, "by_score")[0] == ["Avoid:"]
    assert [piece[0] for piece in tip_template(taken, seen, 100.0)][::2] == ["Helpful:", " Avoid:", " Next, try:"]
    assert "helped most" in constrained_tip_prompt(7.0, "by_score") and "avoid" not in constrained_tip_prompt(7.0, "by_score")
    assert "to avoid" in constrained_tip_prompt(0.0, "by_score") and "helped" not in constrained_tip_prompt(0.0, "by_score")
    assert constrained_tip_prompt(3.0) == CONSTRAINED_TIP_PROMPT.format(score=3.0)
    with pytest.raises(ValueError, match="tip_template: 'slots' is not allowed; choose one of helpful_avoid_next, by_score"):
        tip_template(taken, seen, 0.0, "slots")
    with pytest.raises(ValueError, match="tip_template: 'by_score' needs tip_decoding 'constrained'"):
        EMPO2Config.from_profile("paper", tip_template="by_score")


def test_by_score_tips_of_real_episodes_never_name_one_action_twice(policy_fp32, embedder):
    model, tokenizer = policy_fp32
    _, episodes = play_with_tips(model, tokenizer, embedder, "by_score")
    for episode in episodes:
        match = BY_SCORE.fullmatch(episode.tip)
        assert match, episode.tip
        assert match[1] == ("Helpful" if episode.score > 0 else "Avoid")
        assert match[2] in {turn.executed_action for turn in episode.turns} and match[3] in episode.seen_actions
        assert episode.tip_ids[-1] == tokenizer.eos_token_id and not episode.tip_cut


def test_profiles_choose_their_tips():
    paper = EMPO2Config.from_profile("paper")
    assert paper.tip_decoding == "free" and paper.tip_tokens >= 130  # 100 words fit the free budget
    assert EMPO2Config.from_profile("ci").tip_decoding == "constrained"
    assert EMPO2Config.from_profile("ci", env="webshop").tip_decoding == "constrained"
    with pytest.raises(ValueError, match="tip_decoding: 'short' is not allowed; choose one of free, constrained"):
        EMPO2Config.from_profile("ci", tip_decoding="short")
