"""Group rollouts: N episodes advanced in lock-step, some of them memory-augmented.

For every episode a mode is drawn (`draw_modes`):

    plain       a ~ π(·|s, u)          -> on-policy update without tips
    memory_on   a ~ π(·|s, u, tips)    -> on-policy update with tips in both contexts
    off_policy  a ~ π(·|s, u, tips)    -> off-policy update: scored without tips

Memory-augmented episodes retrieve tips for the current state at every step and
show them inside a `<tip>` block of that turn. Each `Turn` keeps the prompt ids
with and without tips, the sampled response ids and their behaviour log-probs.
After the episodes end, the policy writes one tip per episode (`write_tips`),
batched over the group and reusing the group's KV cache.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from empo2.chat import ChatFormat, Message, format_tip_block
from empo2.config import CHOICES
from empo2.episode import MEMORY_ON_POLICY, OFF_POLICY, PLAIN, Episode, Mode, Turn
from empo2.llm.constrained import FREE_TEXT, ActionEncoder, TemplateConstraint, action_text
from empo2.llm.generation import GroupGenerator
from empo2.llm.vllm_engine import VLLMEngine
from empo2.prompts import (SINGLE_TURN_SYSTEM, SYSTEM_PROMPT, TIP_PROMPT, constrained_tip_prompt,
                           extract_action, memory_content, single_turn_prompt, tip_template)


def draw_modes(n: int, p: float, q: float, rng: np.random.Generator, per_iteration: bool = False) -> list[Mode]:
    """Draw the rollout/update mode of n episodes.

    Per rollout (default, the paper's algorithm): each episode is memory-augmented
    with probability p, and a memory episode is updated off-policy with probability q.
    Per iteration (the authors' release): one draw decides the mode of all n.
    """
    draws = 1 if per_iteration else n
    memory = rng.random(draws) < p
    off_policy = rng.random(draws) < q
    modes = [OFF_POLICY if m and o else MEMORY_ON_POLICY if m else PLAIN for m, o in zip(memory, off_policy)]
    return modes * n if per_iteration else modes


@dataclass
class RolloutTimer:
    """Seconds spent in each part of a rollout (for the cost analysis)."""

    generation: float = 0.0
    environment: float = 0.0
    memory: float = 0.0
    """Embedding states for retrieval, retrieval itself, tip generation, storage."""
    tip_writing: float = 0.0
    """The part of `memory` spent generating tips."""
    novelty: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.__dict__.items()}

    @contextlib.contextmanager
    def measure(self, *parts: str):
        """Add the seconds the block takes to each of `parts`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            for part in parts:
                setattr(self, part, getattr(self, part) + elapsed)


@dataclass
class GroupPlay:
    """One group's episodes while they play in lock-step (`Roller.run`); lists are indexed by episode."""
    envs: list
    episodes: list[Episode]
    infos: list[dict]  # the latest info of each episode (admissible actions, state text)
    states: list[str]  # the text each episode's current state is embedded from
    task_descriptions: list[str]
    histories: list[list[tuple[str, str]]]  # (action, observation) per step, for single-turn prompts
    max_steps: int
    embeddings: np.ndarray | None = None  # (episodes, dim): the current states', when anything needs them
    shown_tips: dict[int, list[str]] = field(default_factory=dict)  # the tips shown in the turn about to be answered


class Roller:
    """Runs group rollouts with one policy; holds what stays fixed between groups."""

    def __init__(self, model, tokenizer, *, env_name: str, response_tokens: int, tip_tokens: int,
                 embedder=None, memory=None, novelty=None, reuse_cache: bool = True,
                 sampling_rng: torch.Generator | None = None, memory_scope: str = "variation",
                 prompt_style: str = "chat", history_turns: int = 2, think_first: bool = True,
                 action_decoding: str = "free", parallel_envs: bool = True,
                 engine=None, repeat_tips: bool = True, tip_decoding: str = "free",
                 tip_template: str = "helpful_avoid_next"):
        options = {"prompt_style": prompt_style, "action_decoding": action_decoding, "tip_decoding": tip_decoding,
                   "tip_template": tip_template}
        for name, value in options.items():
            if value not in CHOICES[name]:
                raise ValueError(f"{name}: {value!r} is not allowed; choose one of {', '.join(CHOICES[name])}")
        self.model = model
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.env_name = env_name
        self.response_tokens = response_tokens
        self.tip_tokens = tip_tokens
        self.embedder = embedder
        self.memory = memory
        self.novelty = novelty
        self.reuse_cache = reuse_cache
        self.sampling_rng = sampling_rng
        """The random number generator the rollouts sample tokens from (None: torch's global one)."""
        self.memory_scope = memory_scope
        self.prompt_style = prompt_style
        self.action_encoder = ActionEncoder(tokenizer) if action_decoding == "constrained" else None
        """Builds each state's constraint when actions are decoded constrained; None for free text."""
        self.parallel_envs = parallel_envs
        """Step the group's environments at the same time where they allow it (False: one after the other)."""
        self.history_turns = history_turns
        self.think_first = think_first
        self.engine = engine
        """A vLLM engine that samples the rollouts (empo2.llm.vllm_engine); None: the policy itself (GroupGenerator)."""
        self.repeat_tips = repeat_tips
        """Show a tip again at later steps that retrieve it (False: once per episode; see EMPO2Config)."""
        self.tip_decoding = tip_decoding
        self.tip_texts = ActionEncoder(tokenizer) if tip_decoding == "constrained" else None
        """Tokenises the pieces of constrained tips; None for free-text tips."""
        self.tip_template = tip_template
        """The slots of a constrained tip (`prompts.tip_template`)."""
        self.timer = RolloutTimer()
        self.last_generator: GroupGenerator | None = None

    @classmethod
    def from_config(cls, cfg, model, tokenizer, *, embedder=None, memory=None, novelty=None,
                    sampling_rng: torch.Generator | None = None, memory_scope: str | None = None) -> "Roller":
        """The roller an `EMPO2Config` describes: the one way the trainer, adaptation, notebooks and CLI build one."""
        return cls(model, tokenizer, env_name=cfg.env, response_tokens=cfg.response_tokens, tip_tokens=cfg.tip_tokens,
                   embedder=embedder, memory=memory, novelty=novelty, reuse_cache=cfg.reuse_cache, sampling_rng=sampling_rng,
                   memory_scope=memory_scope or cfg.memory_scope, prompt_style=cfg.prompt_style,
                   history_turns=cfg.history_turns, think_first=cfg.think_first, action_decoding=cfg.action_decoding,
                   engine=VLLMEngine.from_config(cfg, tokenizer) if cfg.rollout_engine == "vllm" else None,
                   repeat_tips=cfg.repeat_tips, tip_decoding=cfg.tip_decoding, tip_template=cfg.tip_template)

    def scope(self, task: str, variation: int) -> str:
        return f"{task}:{variation}" if self.memory_scope == "variation" else task

    def _embed(self, texts: list[str]) -> np.ndarray:
        return self.embedder.encode(texts)

    def _tips_for(self, episode: Episode, state_embedding: np.ndarray) -> list[str]:
        entries = self.memory.retrieve(state_embedding, self.scope(episode.task, episode.variation))
        tips = [entry.content for entry in entries]
        if not self.repeat_tips:
            shown = {tip for turn in episode.turns for tip in turn.tips_shown}
            tips = [tip for tip in tips if tip not in shown]
        return tips

    def run(self, envs, variations: list[int], modes: list[Mode], *, temperature: float,
            write_tips: bool = False, use_novelty: bool = False, progress=None) -> list[Episode]:
        """Play one episode per env in lock-step; env i plays `variations[i]` in `modes[i]`. Each step: render
        every live conversation, sample the actions (`_generate`), play them (`_act`), record the turns, embed the
        new states and pay the novelty bonus (`_observe`), then show each unfinished episode its next state with
        the tips retrieved for it (`_next_turns`). Tips are written when all episodes have ended."""
        n = len(variations)
        if not (len(envs) >= n == len(modes)):
            raise ValueError("run: need one env, one variation and one mode per episode")
        needs_memory = any(mode != PLAIN for mode in modes)
        if needs_memory and (self.memory is None or self.embedder is None):
            raise ValueError("run: memory-augmented modes need a memory and an embedder")
        if use_novelty and (self.novelty is None or self.embedder is None):
            raise ValueError("run: the novelty reward needs a novelty store and an embedder")
        model_was_training = self.model.training
        self.model.eval()
        generator = self._generator(n, temperature)
        # Tips are stored under state embeddings, so a roller with an embedder computes them for tips too.
        needs_embeddings = needs_memory or use_novelty or (write_tips and self.embedder is not None)
        group = self._start(envs[:n], variations, modes, needs_embeddings, needs_memory)
        active, step = list(range(n)), 0
        while active:
            step += 1
            rendered = {i: self.chat.render(group.episodes[i].messages, add_generation_prompt=True) for i in active}
            responses = self._generate(group, rendered, generator)
            results = self._act(group, active, responses)
            for i in active:
                _record_turn(group.episodes[i], rendered[i], responses[i], results[i], group.shown_tips[i],
                             group.states[i], None if group.embeddings is None else group.embeddings[i].copy())
                group.histories[i].append((results[i].info.get("executed_action") or results[i].info.get("raw_action", ""),
                                           results[i].observation))
                group.states[i] = results[i].info.get("state_text", results[i].observation)
            self._observe(group, active, needs_embeddings, needs_memory, use_novelty)
            still_active = self._next_turns(group, active, results, step)
            if progress is not None:
                progress.update(len(active) - len(still_active))  # episodes finished
                if hasattr(progress, "set_postfix_str"):
                    progress.set_postfix_str(f"step {step}/{group.max_steps}")  # steps played
            active = still_active
        if write_tips:
            with self.timer.measure("memory", "tip_writing"):
                self._write_tips(group.episodes, generator)
        self.model.train(model_was_training)
        return group.episodes

    def _generator(self, n: int, temperature: float):
        """The group's sampler: the vLLM engine's when there is one, else the policy's own."""
        # A single-turn prompt is rewritten every step, so there is no cache to keep.
        reuse_cache = self.reuse_cache and self.prompt_style == "chat"
        if self.engine is not None:
            generator = self.engine.generator(self.model, n, temperature=temperature)
        else:
            generator = GroupGenerator(self.model, self.tokenizer, n, reuse_cache=reuse_cache,
                                       temperature=temperature, sampling_rng=self.sampling_rng)
        self.last_generator = generator
        return generator

    def _start(self, envs, variations: list[int], modes: list[Mode], needs_embeddings: bool,
               needs_memory: bool) -> "GroupPlay":
        """Reset every env, embed the first states, and show each episode its first turn with its tips."""
        with self.timer.measure("environment"):
            first = call_each(envs, [(env.reset, variation) for env, variation in zip(envs, variations)],
                              parallel=self.parallel_envs)
        observations = [observation for observation, _ in first]
        infos = [info for _, info in first]
        group = GroupPlay(
            envs=list(envs), episodes=[Episode(self.env_name, env.task_name, variation, mode)
                                       for env, variation, mode in zip(envs, variations, modes)],
            infos=infos, states=[info.get("state_text", obs) for info, obs in zip(infos, observations)],
            task_descriptions=[info.get("task_description", "") for info in infos],
            histories=[[] for _ in envs], max_steps=envs[0].max_steps)
        group.embeddings = self._timed_embed(group.states, needs_embeddings, memory_part=needs_memory)
        for i, episode in enumerate(group.episodes):
            group.shown_tips[i] = self._retrieve(episode, group.embeddings, i)
            self._show_state(episode, envs[i], 1, group.max_steps, group.task_descriptions[i], group.histories[i],
                             observations[i], infos[i], group.shown_tips[i])
        return group

    def _generate(self, group: "GroupPlay", rendered: dict, generator) -> dict:
        """Sample one response per live episode, constrained to its admissible actions when decoding is."""
        with self.timer.measure("generation"):
            if self.tip_texts is not None:
                for i in rendered:
                    group.episodes[i].seen_actions.update(
                        dict.fromkeys(a for a in group.infos[i].get("valid_actions", []) if not a.endswith(FREE_TEXT)))
            constraints = None
            if self.action_encoder is not None:
                constraints = {i: self.action_encoder.constraint(group.infos[i]["valid_actions"], self.response_tokens,
                                                                 group.infos[i].get("query_words"))
                               for i in rendered}
            return generator.generate({i: r.ids() for i, r in rendered.items()}, self.response_tokens, constraints)

    def _act(self, group: "GroupPlay", active: list[int], responses: dict) -> dict:
        """Play each live episode's response as its action; the step results by episode."""
        with self.timer.measure("environment"):
            calls = []
            for i in active:
                text = self.tokenizer.decode(responses[i].ids, skip_special_tokens=True)
                if self.action_encoder is not None:
                    text = action_text(text)
                calls.append((group.envs[i].step, text if self.prompt_style == "chat" else extract_action(text)))
            results = dict(zip(active, call_each([group.envs[i] for i in active], calls,
                                                 parallel=self.parallel_envs)))
            for i in active:
                group.infos[i] = results[i].info
        return results

    def _observe(self, group: "GroupPlay", active: list[int], needs_embeddings: bool, needs_memory: bool,
                 use_novelty: bool) -> None:
        """Embed the states just reached and pay each step its novelty bonus (`novelty.NoveltyStore.visit`)."""
        new_embeddings = self._timed_embed([group.states[i] for i in active], needs_embeddings,
                                           memory_part=needs_memory)
        if use_novelty:
            with self.timer.measure("novelty"):
                rewards = self.novelty.visit(
                    new_embeddings, [self.scope(group.episodes[i].task, group.episodes[i].variation) for i in active])
                for reward, i in zip(rewards, active):
                    group.episodes[i].turns[-1].intrinsic_reward = float(reward)
        if new_embeddings is not None:
            group.embeddings[active] = new_embeddings

    def _next_turns(self, group: "GroupPlay", active: list[int], results: dict, step: int) -> list[int]:
        """Show each unfinished episode its new state with the tips retrieved for it; the episodes still playing."""
        still_active = []
        for i in active:
            if group.episodes[i].done:
                continue
            group.shown_tips[i] = self._retrieve(group.episodes[i], group.embeddings, i)
            self._show_state(group.episodes[i], group.envs[i], step + 1, group.max_steps, group.task_descriptions[i],
                             group.histories[i], results[i].observation, results[i].info, group.shown_tips[i])
            still_active.append(i)
        return still_active

    def _show_state(self, episode: Episode, env, step: int, max_steps: int, task_description: str,
                    history: list[tuple[str, str]], observation: str, info: dict, tips: list[str]) -> None:
        """Write the state the policy answers at `step` (from 1) into the episode's conversation, with `tips`:
        the chat grows by one user turn (the first after the system prompt); a single-turn prompt is
        rewritten with the task, the last `history_turns` (action, observation) pairs and the observation."""
        block = _block(tips)
        if self.prompt_style == "chat":
            if step == 1:
                episode.messages = [Message("system", SYSTEM_PROMPT),
                                    Message("user", env.first_turn_text(task_description, observation, info),
                                            tips=block)]
            else:
                episode.messages.append(Message("user", env.next_turn_text(observation, info, step, max_steps),
                                                tips=block))
            return
        recent = history[-self.history_turns :] if self.history_turns else []
        text = single_turn_prompt(task_description, step, recent, observation, info, think_first=self.think_first)
        episode.messages = [Message("system", SINGLE_TURN_SYSTEM), Message("user", text, tips=block)]

    def _timed_embed(self, texts, needed: bool, memory_part: bool):
        if not needed:
            return None
        with self.timer.measure("memory" if memory_part else "novelty"):
            return self._embed(texts)

    def _retrieve(self, episode: Episode, embeddings, i: int) -> list[str]:
        if not episode.sampled_with_tips:
            return []
        with self.timer.measure("memory"):
            return self._tips_for(episode, embeddings[i])

    def _write_tips(self, episodes: list[Episode], generator: GroupGenerator) -> None:
        """Ask the policy for one tip per episode, in one batched call over the group: free text, or the
        constrained template whose slots hold text from the episode (`prompts.tip_template`)."""
        prompts, constraints = {}, {}
        for i, episode in enumerate(episodes):
            prompt = (TIP_PROMPT.format(score=episode.score) if self.tip_texts is None
                      else constrained_tip_prompt(episode.score, self.tip_template))
            episode.messages.append(Message("user", prompt))
            prompts[i] = self.chat.render(episode.messages, add_generation_prompt=True).ids()
            taken = [t.executed_action for t in episode.turns if t.executed_action]
            if self.tip_texts is not None and taken:
                pieces = tip_template(list(dict.fromkeys(taken)), list(episode.seen_actions), episode.score,
                                      self.tip_template)
                constraints[i] = TemplateConstraint(self.tip_texts, pieces)
        responses = generator.generate(prompts, self.tip_tokens, constraints)
        for i, episode in enumerate(episodes):
            episode.tip_ids = list(responses[i].ids)
            episode.tip = self.tokenizer.decode(episode.tip_ids, skip_special_tokens=True).strip()
            episode.tip_cut = i not in constraints and episode.tip_ids[-1:] != [self.tokenizer.eos_token_id]
            episode.messages.pop()  # the tip prompt is not part of the trained conversation

    def tip_entries(self, episodes: list[Episode]) -> tuple[np.ndarray, list[str], list[float], list[str]] | None:
        """Each episode's tip as memory entries, one per state it acted in: (keys (n, dim), contents, scores,
        scopes); None when no episode wrote a tip."""
        keys, contents, scores, scopes = [], [], [], []
        for episode in episodes:
            if not episode.tip or not episode.turns:
                continue
            for turn in episode.turns:
                keys.append(turn.state_embedding)
                contents.append(memory_content(episode.tip, turn.executed_action, episode.score))
                scores.append(episode.score)
                scopes.append(self.scope(episode.task, episode.variation))
        return (np.stack(keys), contents, scores, scopes) if keys else None

    def store_tips(self, episodes: list[Episode]) -> int:
        """Add each episode's tip to memory, keyed by every state it acted in. Returns entries added."""
        with self.timer.measure("memory"):
            entries = self.tip_entries(episodes)
            return self.memory.add_many(*entries) if entries else 0


def _record_turn(episode: Episode, rendered, response, result, tips_shown: list[str], state_text: str,
                 state_embedding: np.ndarray | None) -> None:
    """Append the step just played to the episode: its `Turn`, the policy's answer in the conversation, the
    score so far and whether it ended."""
    episode.turns.append(Turn(
        prompt_ids=rendered.ids(with_tips=True), prompt_ids_tip_free=rendered.ids(with_tips=False),
        response_ids=response.ids, behaviour_logprobs=response.logprobs, response_allowed=response.allowed,
        behaviour_entropies=response.entropies,
        raw_action=result.info.get("raw_action", ""), executed_action=result.info.get("executed_action") or "",
        observation=result.observation, reward=result.reward, score=result.score,
        tips_shown=tips_shown, state_text=state_text, state_embedding=state_embedding,
    ))
    episode.messages.append(Message("assistant", ids=response.ids))
    episode.score = result.score
    episode.env_restarts += int(bool(result.info.get("env_restarted")))
    if result.done:
        episode.done, episode.truncated = True, result.truncated


def call_each(envs, calls: list[tuple], *, parallel: bool = True) -> list:
    """Run `fn(arg)` for each (fn, arg), one call per env of `envs`; results in the order of `calls`.

    Environments whose instances are separate processes (`parallel_steps`) run their
    calls at the same time from threads, so a group's JVM steps overlap instead of
    queueing; the results are those of calling them one after the other.
    """
    if not (parallel and len(calls) > 1 and all(getattr(env, "parallel_steps", False) for env in envs)):
        return [fn(arg) for fn, arg in calls]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(fn, arg) for fn, arg in calls]
        return [future.result() for future in futures]


def _block(tips: list[str]) -> str | None:
    return format_tip_block(tips) if tips else None
