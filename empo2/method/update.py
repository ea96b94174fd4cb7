"""The policy update of one iteration: `ppo_epochs` passes of the hybrid clipped objective over its episodes.

    for every episode whose loss has a gradient (non-zero advantage, or a KL term):
        θ_old log-probs in the context the episode was played in (with tips where shown)
        reference log-probs in the context it is trained in (only with a KL term)
    for each epoch, for each mini-batch of a fresh permutation of the episodes:
        for each episode, one forward pass at a time:
            π_θ log-probs in its training context: plain / with tips / tip-free (off-policy)
            the hybrid clipped loss (empo2.method.loss) over the mini-batch's token count; backward
        clip the gradient norm; one optimiser step

The per-token inputs of the loss travel as a `TokenBatch`; `HybridLoss` is the
loss with the config's settings bound once. Symbols: T action tokens.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, fields

import numpy as np
import torch

from empo2.config import EMPO2Config
from empo2.episode import Episode
from empo2.llm.logprobs import episode_logprobs, forward_passes, pass_allowed, sequence_logprobs, tokens_processed
from empo2.llm.models import default_dtype
from empo2.method.distributed import Processes
from empo2.method.loss import loss_metrics, policy_loss


@dataclass
class TokenBatch:
    """What the loss reads about T action tokens: one episode's, a slice of them, or a mini-batch's."""

    advantages: torch.Tensor  # (T,) the GRPO advantage of each token's episode
    mask: torch.Tensor  # (T,) 1 for decisions, 0 for forced tokens of constrained decoding (one allowed token)
    modes: torch.Tensor  # (T,) long, the Mode of each token's episode
    sequence_ids: torch.Tensor  # (T,) long, each token's turn, distinct across the turns of a batch
    old_logprobs: torch.Tensor | None = None  # (T,) θ_old in the behaviour context; None: θ_old = θ
    ref_logprobs: torch.Tensor | None = None  # (T,) the reference policy in the training context (KL only)

    @classmethod
    def of(cls, episode: Episode, advantage: float, old_logprobs: torch.Tensor | None = None,
           ref_logprobs: torch.Tensor | None = None) -> TokenBatch:
        """Every action token gets the episode's advantage; forced tokens are no decision and are masked out."""
        lengths = [len(turn.response_ids) for turn in episode.turns]
        total = sum(lengths)
        return cls(
            advantages=torch.full((total,), float(advantage)),  # (T,)
            mask=torch.tensor(episode.decision_mask(), dtype=torch.float32),  # (T,)
            modes=torch.full((total,), int(episode.mode), dtype=torch.long),  # (T,)
            sequence_ids=torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)),  # (T,)
            old_logprobs=old_logprobs, ref_logprobs=ref_logprobs,
        )

    def to(self, device) -> TokenBatch:
        return TokenBatch(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                             for f in fields(self)})

    def __getitem__(self, piece: slice) -> TokenBatch:
        return TokenBatch(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[piece]
                             for f in fields(self)})

    @classmethod
    def cat(cls, batches: list[TokenBatch]) -> TokenBatch:
        """One batch of several; each batch's turns get their own sequence ids."""
        offset, sequence_ids = 0, []
        for batch in batches:
            sequence_ids.append(batch.sequence_ids + offset)
            offset += int(batch.sequence_ids.max()) + 1 if len(batch.sequence_ids) else 0
        joined = lambda name: (None if any(getattr(b, name) is None for b in batches)  # noqa: E731
                               else torch.cat([getattr(b, name) for b in batches]))
        return cls(advantages=joined("advantages"), mask=joined("mask"), modes=joined("modes"),
                   sequence_ids=torch.cat(sequence_ids), old_logprobs=joined("old_logprobs"),
                   ref_logprobs=joined("ref_logprobs"))


class HybridLoss:
    """`empo2.method.loss.policy_loss` with a config's clipping, δ and KL settings bound once."""

    def __init__(self, cfg: EMPO2Config):
        self.settings = cfg.loss_settings

    def __call__(self, new_logprobs: torch.Tensor, batch: TokenBatch, normalizer: float, return_sums: bool = False
                 ) -> tuple[torch.Tensor, dict]:
        """Loss of the (T,) `new_logprobs` summed over the batch's tokens and divided by `normalizer`."""
        old = new_logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs  # (T,)
        return policy_loss(new_logprobs, old, batch.advantages, batch.mask, batch.modes, batch.sequence_ids,
                           ref_logprobs=batch.ref_logprobs, normalizer=normalizer, return_sums=return_sums,
                           **self.settings)


class PolicyUpdate:
    """The optimiser and the update rule of a run; `update(episodes, advantages)` runs one iteration's update."""

    def __init__(self, model, cfg: EMPO2Config, rng: np.random.Generator, precision=contextlib.nullcontext,
                 processes: Processes | None = None):
        self.model = model
        self.processes = processes or Processes()
        """The training processes: gradients are summed over them (one process: nothing to do)."""
        self.cfg = cfg
        self.rng = rng
        """The trainer's generator: mini-batch orders are drawn from it (a resumed run draws the same)."""
        self.precision = precision
        self.device = next(model.parameters()).device
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = self.processes.optimizer(self.trainable, lr=cfg.lr, shard=cfg.shard_optimizer)
        self.loss = HybridLoss(cfg)
        self.reference = None
        """The KL term's reference policy when every weight trains: a frozen copy of the initial model in the device's
        fast dtype (bf16 where it is fast, as TRL's create_reference_model keeps: it halves the copy's memory).
        LoRA runs need no copy: the base model with the adapter switched off is exactly the initial policy."""
        if cfg.kl_beta > 0 and not hasattr(model, "disable_adapter"):
            self.reference = copy.deepcopy(model).requires_grad_(False).eval().to(default_dtype(self.device))

    def __call__(self, episodes: list[Episode | None], advantages: torch.Tensor,
                 decisions: list[int] | None = None) -> dict:
        """`ppo_epochs` passes over the iteration's episodes. Returns the update's metrics.

        episodes: every episode of the iteration, None where another process played it (and scores it).
        advantages: (n_episodes,); decisions: each episode's decision-token count (default: counted here).
        """
        cfg = self.cfg
        if decisions is None:
            decisions = [e.decision_count() for e in episodes]
        # Zero-advantage episodes have exactly zero policy gradient; without a KL term
        # they only count towards the token normaliser, so their forward passes are skipped.
        has_gradient = [bool(a != 0) or cfg.kl_beta > 0 for a in advantages.tolist()]
        needs_pass = [g and e is not None for g, e in zip(has_gradient, episodes)]  # ... and played here
        size = cfg.minibatch_episodes or len(episodes)
        orders = [self.rng.permutation(len(episodes)) for _ in range(cfg.ppo_epochs)]
        old_from_first_pass = self.old_from_first_pass(episodes, orders[0][:size])
        batches = self.token_batches(episodes, advantages, needs_pass, old_from_first_pass)  # 1. θ_old, reference

        # 2. clipped updates, each mode scored in its own context
        self.model.train()
        history = []
        for order in orders:
            for start in range(0, len(order), size):
                minibatch = [int(i) for i in order[start : start + size]]
                normalizer = float(max(1, sum(decisions[i] for i in minibatch)))  # the whole mini-batch's tokens
                self.optimizer.zero_grad(set_to_none=True)
                scored = []  # (new log-probs (T_i,), token batch) of the mini-batch's episodes played here
                for i in minibatch:
                    if needs_pass[i]:
                        new = self.backward(episodes[i], batches[i], normalizer)  # (T_i,)
                        if batches[i].old_logprobs is None:  # θ_old = θ here: this pass's ratio is exactly 1
                            batches[i].old_logprobs = new
                        scored.append((new, batches[i]))
                self.processes.sum_gradients(self.trainable)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, cfg.max_grad_norm)
                if any(has_gradient[i] for i in minibatch):
                    self.optimizer.step()
                    history.append({"update/grad_norm": float(grad_norm), **self.step_metrics(scored, normalizer)})
        if not history:
            return {"update/skipped": 1.0}
        return {**self.tokens_read(episodes, needs_pass, old_from_first_pass),
                **{k: float(np.mean([h[k] for h in history if k in h])) for k in {k for h in history for k in h}}}

    def old_from_first_pass(self, episodes: list[Episode | None], first_minibatch) -> set[int]:
        """The episodes whose θ_old log-probs are taken from their first gradient pass, with no separate no-grad
        pass: until the first optimiser step θ_old = θ, so an episode of the first mini-batch that θ_old and θ
        score in the same context (not off-policy) gets exactly θ_old's values there (equal to a separate no-grad
        pass up to float rounding; benchmarks/bench.py times both)."""
        chosen = [(int(i), episodes[int(i)]) for i in first_minibatch]
        return {i for i, e in chosen if e is not None and e.sampled_with_tips == e.trained_with_tips}

    def token_batches(self, episodes: list[Episode | None], advantages: torch.Tensor, needs_pass: list[bool],
                      old_from_first_pass: set[int]) -> dict[int, TokenBatch]:
        """Each episode's `TokenBatch`, with θ_old's log-probs in its behaviour context (unless taken from the
        first gradient pass) and the reference policy's in its training context (KL term only); no gradient."""
        batches = {}
        with torch.no_grad(), self.precision():
            for i, episode in enumerate(episodes):
                if not needs_pass[i]:
                    continue
                old = ref = None
                if i not in old_from_first_pass:
                    old = self.logprobs(episode, episode.sampled_with_tips)  # (T_i,) behaviour context
                if self.cfg.kl_beta > 0:
                    with self.reference_policy() as reference:
                        ref = self.logprobs(episode, episode.trained_with_tips, reference)  # (T_i,)
                batches[i] = TokenBatch.of(episode, advantages[i], old, ref).to(self.device)
        return batches

    def step_metrics(self, scored: list[tuple[torch.Tensor, TokenBatch]], normalizer: float) -> dict[str, float]:
        """The loss and its metrics over one optimiser step's mini-batch: each process adds up its own tokens'
        sums, and the sums are added over the processes."""
        if scored:
            with torch.no_grad():
                loss, sums = self.loss(torch.cat([new for new, _ in scored]), TokenBatch.cat([b for _, b in scored]),
                                       normalizer, return_sums=True)
        else:  # every episode of this mini-batch was played by another process: one masked-out token
            empty = TokenBatch(advantages=torch.zeros(1), mask=torch.zeros(1), modes=torch.zeros(1, dtype=torch.long),
                               sequence_ids=torch.zeros(1, dtype=torch.long),
                               ref_logprobs=torch.zeros(1) if self.cfg.kl_beta > 0 else None).to(self.device)
            loss, sums = self.loss(torch.zeros(1, device=self.device), empty, normalizer, return_sums=True)
        sums = self.processes.add_up({"loss": loss.detach(), **sums}, maxima={k for k in sums if "ratio_max" in k})
        loss = sums.pop("loss")
        return {"update/loss": float(loss), **{f"update/{k}": v for k, v in loss_metrics(sums).items()}}

    def tokens_read(self, episodes: list[Episode | None], needs_pass: list[bool],
                    old_from_first_pass: set[int]) -> dict[str, float]:
        """The tokens the update's forward passes read: with a gradient (every epoch's) and without (θ_old's, the
        reference policy's), and all of them per token of the trajectories it trains on."""
        read = lambda e, with_tips: tokens_processed(e, with_tips=with_tips, packed=self.cfg.packed_logprobs)  # noqa: E731
        trajectory, with_gradient, without = 0, 0, 0
        for i, episode in enumerate(episodes):
            if not needs_pass[i]:
                continue
            trained = read(episode, episode.trained_with_tips)
            trajectory += trained
            with_gradient += self.cfg.ppo_epochs * trained
            without += ((self.cfg.kl_beta > 0) * trained
                        + (i not in old_from_first_pass) * read(episode, episode.sampled_with_tips))
        counts = self.processes.add_up({name: torch.tensor(value, dtype=torch.float64, device=self.device) for name, value
                                        in (("trajectory", trajectory), ("with_gradient", with_gradient),
                                            ("without", without))})
        counts = {name: float(value) for name, value in counts.items()}
        return {"update/tokens_read_with_gradient": counts["with_gradient"],
                "update/tokens_read_without_gradient": counts["without"],
                "update/tokens_read_per_trajectory_token":
                    (counts["with_gradient"] + counts["without"]) / max(1.0, counts["trajectory"])}

    def logprobs(self, episode: Episode, with_tips: bool, model=None) -> torch.Tensor:
        """(T,) float32 log-probs of the episode's action tokens in one context, with the sampling temperature,
        under `model` (default: the policy)."""
        return episode_logprobs(model or self.model, episode, with_tips=with_tips, packed=self.cfg.packed_logprobs,
                                temperature=self.cfg.temperature).float()

    def backward(self, episode: Episode, batch: TokenBatch, normalizer: float) -> torch.Tensor:
        """Accumulate the gradient of `episode`'s loss, one forward pass at a time; its new log-probs: (T,).

        With a fixed normaliser the loss is a sum over turns (δ drops whole turns at most),
        so each forward pass is backpropagated on its own and only one pass's activations
        are alive at a time, however many turns a non-append-only episode has.
        Off-policy episodes are scored WITHOUT their tips: the distillation step.
        """
        cfg = self.cfg
        passes = forward_passes(episode, with_tips=episode.trained_with_tips, packed=cfg.packed_logprobs)
        allowed = pass_allowed(episode, [spans for _, spans in passes])
        pieces, first = [], 0
        for (ids, spans), sets in zip(passes, allowed):
            with self.precision():
                new = sequence_logprobs(self.model, ids, spans, temperature=cfg.temperature, allowed=sets).float()  # (t,)
            piece = slice(first, first + len(new))  # this pass's action tokens
            first += len(new)
            loss, _ = self.loss(new, batch[piece], normalizer)
            if loss.requires_grad:  # a pass whose action tokens were all forced has no gradient
                loss.backward()
            pieces.append(new.detach())
        return torch.cat(pieces)

    @contextlib.contextmanager
    def reference_policy(self):
        """The initial policy: the base model with LoRA switched off, or the frozen copy of a full fine-tune."""
        if self.reference is not None:
            yield self.reference
            return
        with self.model.disable_adapter():
            yield self.model
