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

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from empo2.chat import ChatFormat, Message, format_tip_block
from empo2.constrained import FREE_TEXT, ActionEncoder, TemplateConstraint, action_text
from empo2.generation import GroupGenerator
from empo2.loss import MEMORY_ON_POLICY, OFF_POLICY, PLAIN, Mode
from empo2.prompts import (CONSTRAINED_TIP_PROMPT, SINGLE_TURN_SYSTEM, SYSTEM_PROMPT, TIP_PROMPT, extract_action,
                           memory_content, single_turn_prompt, tip_template)


@dataclass
class Turn:
    """One agent step: what the policy saw, what it sampled, what happened."""

    prompt_ids: list[int]
    """Behaviour context: the conversation so far, with tips where they were shown."""
    prompt_ids_tip_free: list[int]
    """The same conversation with every tip block removed (token level)."""
    response_ids: list[int]
    behaviour_logprobs: list[float]
    response_allowed: list[tuple[int, ...] | None] | None
    """Constrained decoding: per response token, the ids allowed when it was sampled; None: free text."""
    raw_action: str
    executed_action: str
    observation: str
    reward: float
    score: float
    tips_shown: list[str] = field(default_factory=list)
    state_text: str = ""
    """State in which the action was taken (memory key, novelty)."""
    intrinsic_reward: float = 0.0
    state_embedding: np.ndarray | None = field(default=None, repr=False)
    """Embedding of `state_text` when the rollout computed one (reused as the memory key)."""

    def allowed_sets(self) -> list[tuple[int, ...] | None]:
        """Per response token: the ids allowed when it was sampled (None: any token)."""
        return self.response_allowed or [None] * len(self.response_ids)


@dataclass
class Episode:
    """One episode of one task variation, with everything the update needs."""

    env_name: str
    task: str
    variation: int
    mode: Mode
    """PLAIN, MEMORY_ON_POLICY or OFF_POLICY (see empo2.loss)."""
    messages: list[Message] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    score: float = 0.0
    """Final environment score, in [-100, 100] for ScienceWorld."""
    done: bool = False
    truncated: bool = False
    tip: str = ""
    tip_ids: list[int] = field(default_factory=list)
    """The tip's sampled token ids (its text is their decoding)."""
    tip_cut: bool = False
    """A free-text tip that the `tip_tokens` budget ended before the policy did."""
    seen_actions: dict[str, None] = field(default_factory=dict)
    """Constrained tips: the admissible actions of the states it acted in, in order (a constrained tip's slots)."""
    env_restarts: int = 0

    @property
    def sampled_with_tips(self) -> bool:
        """Acted with tips shown (memory-on-policy and off-policy); θ_old scores it with them."""
        return Mode(self.mode).sampled_with_tips

    @property
    def trained_with_tips(self) -> bool:
        """Scored by π_θ with its tips in context (memory-on-policy only; off-policy drops them)."""
        return Mode(self.mode).trained_with_tips

    @property
    def mode_name(self) -> str:
        return Mode(self.mode).label

    @property
    def intrinsic_return(self) -> float:
        return float(sum(turn.intrinsic_reward for turn in self.turns))

    @property
    def success(self) -> bool:
        return self.score >= 100.0


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


class Roller:
    """Runs group rollouts with one policy; holds what stays fixed between groups."""

    def __init__(self, model, tokenizer, *, env_name: str, response_tokens: int, tip_tokens: int,
                 embedder=None, memory=None, novelty=None, reuse_cache: bool = True,
                 generator: torch.Generator | None = None, memory_scope: str = "variation",
                 prompt_style: str = "chat", history_turns: int = 2, think_first: bool = True,
                 action_decoding: str = "free", parallel_envs: bool = True, cache_layout: str = "ragged",
                 engine=None, repeat_tips: bool = True, tip_decoding: str = "free"):
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
        self.generator = generator
        self.memory_scope = memory_scope
        if prompt_style not in ("chat", "single_turn"):
            raise ValueError(f"prompt_style: {prompt_style!r} is not allowed; choose chat or single_turn")
        self.prompt_style = prompt_style
        if action_decoding not in ("free", "constrained"):
            raise ValueError(f"action_decoding: {action_decoding!r} is not allowed; choose free or constrained")
        self.actions = ActionEncoder(tokenizer) if action_decoding == "constrained" else None
        """Builds each state's constraint when actions are decoded constrained; None for free text."""
        self.parallel_envs = parallel_envs
        """Step the group's environments at the same time where they allow it (False: one after the other)."""
        self.cache_layout = cache_layout
        """KV cache layout: ragged (each row its own length), padded or plain; see empo2.generation."""
        self.history_turns = history_turns
        self.think_first = think_first
        self.engine = engine
        """A vLLM engine that samples the rollouts (empo2.vllm_engine); None: the policy itself (GroupGenerator)."""
        self.repeat_tips = repeat_tips
        """Show a tip again at later steps that retrieve it (False: once per episode; see EMPO2Config)."""
        if tip_decoding not in ("free", "constrained"):
            raise ValueError(f"tip_decoding: {tip_decoding!r} is not allowed; choose free or constrained")
        self.tip_decoding = tip_decoding
        self.tip_texts = ActionEncoder(tokenizer) if tip_decoding == "constrained" else None
        """Tokenises the pieces of constrained tips; None for free-text tips."""
        self.timer = RolloutTimer()
        self.last_generator: GroupGenerator | None = None

    @classmethod
    def from_config(cls, cfg, model, tokenizer, *, embedder=None, memory=None, novelty=None,
                    generator: torch.Generator | None = None, memory_scope: str | None = None) -> "Roller":
        """The roller an `EMPO2Config` describes: the one way the trainer, adaptation, notebooks and CLI build one."""
        return cls(model, tokenizer, env_name=cfg.env, response_tokens=cfg.response_tokens, tip_tokens=cfg.tip_tokens,
                   embedder=embedder, memory=memory, novelty=novelty, reuse_cache=cfg.reuse_cache, generator=generator,
                   memory_scope=memory_scope or cfg.memory_scope, prompt_style=cfg.prompt_style,
                   history_turns=cfg.history_turns, think_first=cfg.think_first, action_decoding=cfg.action_decoding,
                   engine=_vllm_engine(cfg, tokenizer) if cfg.rollout_engine == "vllm" else None,
                   repeat_tips=cfg.repeat_tips, tip_decoding=cfg.tip_decoding)

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
        """Play one episode per env in lock-step; env i plays `variations[i]` in `modes[i]`."""
        n = len(variations)
        if not (len(envs) >= n == len(modes)):
            raise ValueError("run: need one env, one variation and one mode per episode")
        model_was_training = self.model.training
        self.model.eval()
        # A single-turn prompt is rewritten every step, so there is no cache to keep.
        reuse_cache = self.reuse_cache and self.prompt_style == "chat"
        if self.engine is not None:
            generator = self.engine.generator(self.model, n, temperature=temperature)
        else:
            generator = GroupGenerator(self.model, self.tokenizer, n, reuse_cache=reuse_cache,
                                       temperature=temperature, generator=self.generator, layout=self.cache_layout)
        self.last_generator = generator
        needs_memory = any(mode != PLAIN for mode in modes)
        if needs_memory and (self.memory is None or self.embedder is None):
            raise ValueError("run: memory-augmented modes need a memory and an embedder")
        if use_novelty and (self.novelty is None or self.embedder is None):
            raise ValueError("run: the novelty reward needs a novelty store and an embedder")
        # Tips are stored under state embeddings, so a roller with an embedder computes them for tips too.
        needs_embeddings = needs_memory or use_novelty or (write_tips and self.embedder is not None)

        episodes, observations, infos = [], [], []  # infos: the latest info dict of each episode
        start = time.perf_counter()
        for (observation, info), env, variation, mode in zip(
                call_each(envs, [(env.reset, variation) for env, variation in zip(envs, variations)],
                          parallel=self.parallel_envs),
                envs, variations, modes):
            episodes.append(Episode(self.env_name, env.task_name, variation, mode))
            observations.append(observation)
            infos.append(info)
        self.timer.environment += time.perf_counter() - start
        max_steps = envs[0].max_steps
        states = [info.get("state_text", obs) for info, obs in zip(infos, observations)]
        embeddings = self._timed_embed(states, needs_embeddings, memory_part=needs_memory)

        shown_tips: dict[int, list[str]] = {}
        task_descriptions: list[str] = []
        histories: list[list[tuple[str, str]]] = [[] for _ in range(n)]  # (action, observation) per episode
        for i, episode in enumerate(episodes):
            tips = self._retrieve(episode, embeddings, i)
            task_descriptions.append(infos[i].get("task_description", ""))
            if self.prompt_style == "chat":
                text = envs[i].first_turn_text(task_descriptions[i], observations[i], infos[i])
                episode.messages = [Message("system", SYSTEM_PROMPT), Message("user", text, tips=_block(tips))]
            else:
                text = single_turn_prompt(task_descriptions[i], 1, [], observations[i], infos[i],
                                          think_first=self.think_first)
                episode.messages = [Message("system", SINGLE_TURN_SYSTEM), Message("user", text, tips=_block(tips))]
            shown_tips[i] = tips  # shown in the turn about to be answered

        active = list(range(n))
        step = 0
        while active:
            step += 1
            rendered = {i: self.chat.render(episodes[i].messages, add_generation_prompt=True) for i in active}
            start = time.perf_counter()
            if self.tip_texts is not None:
                for i in active:
                    episodes[i].seen_actions.update(
                        dict.fromkeys(a for a in infos[i].get("valid_actions", []) if not a.endswith(FREE_TEXT)))
            constraints = None
            if self.actions is not None:
                constraints = {i: self.actions.constraint(infos[i]["valid_actions"], self.response_tokens,
                                                          infos[i].get("query_words"))
                               for i in active}
            responses = generator.generate({i: r.ids() for i, r in rendered.items()}, self.response_tokens,
                                           constraints)
            self.timer.generation += time.perf_counter() - start

            start = time.perf_counter()
            actions = []
            for i in active:
                text = self.tokenizer.decode(responses[i].ids, skip_special_tokens=True)
                if self.actions is not None:
                    text = action_text(text)
                actions.append((envs[i].step, text if self.prompt_style == "chat" else extract_action(text)))
            results = dict(zip(active, call_each([envs[i] for i in active], actions, parallel=self.parallel_envs)))
            for i in active:
                infos[i] = results[i].info
            self.timer.environment += time.perf_counter() - start

            for i in active:
                response = responses[i]
                result, episode = results[i], episodes[i]
                episode.turns.append(Turn(
                    prompt_ids=rendered[i].ids(with_tips=True),
                    prompt_ids_tip_free=rendered[i].ids(with_tips=False),
                    response_ids=response.ids, behaviour_logprobs=response.logprobs,
                    response_allowed=response.allowed,
                    raw_action=result.info.get("raw_action", ""),
                    executed_action=result.info.get("executed_action") or "",
                    observation=result.observation, reward=result.reward, score=result.score,
                    tips_shown=shown_tips[i], state_text=states[i],
                    state_embedding=None if embeddings is None else embeddings[i].copy(),
                ))
                episode.messages.append(Message("assistant", ids=response.ids))
                histories[i].append((result.info.get("executed_action") or result.info.get("raw_action", ""),
                                     result.observation))
                episode.score = result.score
                episode.env_restarts += int(bool(result.info.get("env_restarted")))
                if result.done:
                    episode.done, episode.truncated = True, result.truncated
                states[i] = result.info.get("state_text", result.observation)

            new_embeddings = self._timed_embed([states[i] for i in active], needs_embeddings, memory_part=needs_memory)
            if use_novelty:
                start = time.perf_counter()
                rewards = self.novelty.visit(
                    new_embeddings, [self.scope(episodes[i].task, episodes[i].variation) for i in active]
                )
                for reward, i in zip(rewards, active):
                    episodes[i].turns[-1].intrinsic_reward = float(reward)
                self.timer.novelty += time.perf_counter() - start
            if new_embeddings is not None:
                embeddings[active] = new_embeddings

            still_active = []
            for i in active:
                episode = episodes[i]
                if episode.done:
                    continue
                tips = self._retrieve(episode, embeddings, i)
                if self.prompt_style == "chat":
                    text = envs[i].next_turn_text(results[i].observation, results[i].info, step + 1, max_steps)
                    episode.messages.append(Message("user", text, tips=_block(tips)))
                else:
                    recent = histories[i][-self.history_turns :] if self.history_turns else []
                    text = single_turn_prompt(task_descriptions[i], step + 1, recent, results[i].observation,
                                              results[i].info, think_first=self.think_first)
                    episode.messages = [Message("system", SINGLE_TURN_SYSTEM), Message("user", text, tips=_block(tips))]
                shown_tips[i] = tips
                still_active.append(i)
            if progress is not None:
                progress.update(len(active) - len(still_active))  # episodes finished
                if hasattr(progress, "set_postfix_str"):
                    progress.set_postfix_str(f"step {step}/{max_steps}")  # steps played
            active = still_active

        if write_tips:
            start = time.perf_counter()
            self._write_tips(episodes, generator)
            self.timer.memory += time.perf_counter() - start
            self.timer.tip_writing += time.perf_counter() - start
        self.model.train(model_was_training)
        return episodes

    def _timed_embed(self, texts, needed: bool, memory_part: bool):
        if not needed:
            return None
        start = time.perf_counter()
        vectors = self._embed(texts)
        elapsed = time.perf_counter() - start
        if memory_part:
            self.timer.memory += elapsed
        else:
            self.timer.novelty += elapsed
        return vectors

    def _retrieve(self, episode: Episode, embeddings, i: int) -> list[str]:
        if not episode.sampled_with_tips:
            return []
        start = time.perf_counter()
        tips = self._tips_for(episode, embeddings[i])
        self.timer.memory += time.perf_counter() - start
        return tips

    def _write_tips(self, episodes: list[Episode], generator: GroupGenerator) -> None:
        """Ask the policy for one tip per episode, in one batched call over the group: free text, or the
        constrained template whose slots hold text from the episode (`prompts.tip_template`)."""
        prompts, constraints = {}, {}
        for i, episode in enumerate(episodes):
            prompt = TIP_PROMPT if self.tip_texts is None else CONSTRAINED_TIP_PROMPT
            episode.messages.append(Message("user", prompt.format(score=episode.score)))
            prompts[i] = self.chat.render(episode.messages, add_generation_prompt=True).ids()
            taken = [t.executed_action for t in episode.turns if t.executed_action]
            if self.tip_texts is not None and taken:
                constraints[i] = TemplateConstraint(self.tip_texts,
                                                    tip_template(list(dict.fromkeys(taken)), list(episode.seen_actions)))
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
        start = time.perf_counter()
        entries = self.tip_entries(episodes)
        added = self.memory.add_many(*entries) if entries else 0
        self.timer.memory += time.perf_counter() - start
        return added


def _vllm_engine(cfg, tokenizer):
    from empo2.vllm_engine import VLLMEngine

    return VLLMEngine.from_config(cfg, tokenizer)


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
