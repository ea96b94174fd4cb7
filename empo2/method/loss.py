"""The hybrid clipped policy loss of EMPO², token level.

Every action token of a mini-batch comes from an episode with one of three modes:

| mode | code | context of old log-prob | context of new log-prob |
|---|---|---|---|
| PLAIN            | 0 | s, u        | s, u        |
| MEMORY_ON_POLICY | 1 | s, u, tips  | s, u, tips  |
| OFF_POLICY       | 2 | s, u, tips  | s, u        |

The caller computes the log-probs in the right contexts; this module only sees
(T,) tensors, T = number of token positions in the mini-batch. The objective is
the PPO clipped surrogate with asymmetric clipping ("clip-higher") and dual
clipping for negative advantages, as in verl:

    ratio    = exp(new - old)
    pg_loss1 = -A * ratio
    pg_loss2 = -A * clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg_loss  = max(pg_loss1, pg_loss2),  and for A < 0: min(pg_loss, -A * dual_clip)

Off-policy tokens whose tip-free probability exp(new) is below δ are dropped from
the policy-gradient term (their ratios explode): per token, or per turn
("sequence": one low token drops its whole turn). An optional k3 KL penalty to a
reference policy is added per token. The loss is a token mean over the
mini-batch's action tokens.
"""

from __future__ import annotations

import torch

from empo2.config import CHOICES
from empo2.episode import MEMORY_ON_POLICY, MODE_NAMES, OFF_POLICY, PLAIN


# exp(20) ~ 5e8 is far past any clip range; the bound only keeps exp() finite so
# that garbage log-probs cannot turn the gradient into NaN (verl does the same).
_MAX_LOGRATIO = 20.0


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where the 0/1 `mask` is set (masked entries may hold inf or NaN)."""
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim)


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    modes: torch.Tensor,
    sequence_ids: torch.Tensor | None,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.3,
    dual_clip: float = 10.0,
    delta: float = 0.0067,
    delta_mode: str = "token",
    ref_logprobs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    normalizer: float | None = None,
    return_sums: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss over the (T,) action tokens of a mini-batch.

    Args:
        new_logprobs: (T,) log π_θ(a_t | context_new), with grad; tip-free for OFF_POLICY tokens.
        old_logprobs: (T,) log π_θold(a_t | context_old), the behaviour policy.
        advantages: (T,) advantage of each token (its episode's GRPO advantage).
        token_mask: (T,) 1 for real action tokens, 0 for padding and prompt positions.
        modes: (T,) long mode code of each token's episode (PLAIN, MEMORY_ON_POLICY, OFF_POLICY).
        sequence_ids: (T,) long id of each token's turn, distinct across the turns of the
            mini-batch; only read when delta_mode="sequence" (may be None otherwise).
        clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high].
        dual_clip: for A < 0 the per-token loss is capped at -A * dual_clip (> 1).
        delta: OFF_POLICY tokens with exp(new_logprobs) < delta get no policy-gradient term.
        delta_mode: "token" drops those tokens, "sequence" drops every token of a turn
            holding one, "none" drops nothing.
        ref_logprobs: (T,) log-probs of the reference policy, for the KL penalty and `kl_ref`.
        kl_beta: weight of the k3 KL estimate exp(ref - new) - (ref - new) - 1 added per token.
        normalizer: number of tokens the summed loss is divided by; default token_mask.sum().
            Pass the whole mini-batch's token count when accumulating gradients over chunks.
        return_sums: return the sums the metrics are made of instead (`loss_metrics` turns them into
            metrics), so that processes holding parts of a mini-batch can add theirs up.

    A δ-dropped token still counts in the normalizer: the loss is a token mean over all
    action tokens of the mini-batch, dropped tokens contributing zero (plus their KL term).

    Returns the scalar loss and metrics (python floats, listed in `loss_metrics`), overall and per
    mode present, e.g. "clip_frac" and "clip_frac/off_policy".
    """
    _check_args(new_logprobs, old_logprobs, advantages, token_mask, modes, sequence_ids, ref_logprobs,
                clip_low, clip_high, dual_clip, delta, delta_mode, kl_beta, normalizer)
    # Ratios of bf16 log-probs are too coarse; do the arithmetic in float32.
    new = new_logprobs.float()                                                # (T,)
    old = old_logprobs.float()                                                # (T,)
    adv = advantages.float()                                                  # (T,)
    mask = token_mask.bool()                                                  # (T,)

    logratio = (new - old).clamp(-_MAX_LOGRATIO, _MAX_LOGRATIO)              # (T,)
    ratio = torch.exp(logratio)                                               # (T,)
    pg_loss, clipped, dual_clipped = clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip)   # (T,) each

    drop = _delta_drop(new.detach(), modes, mask, sequence_ids, delta, delta_mode)   # (T,)
    keep = (~drop).float()                                                    # (T,)
    pg_term = pg_loss * keep                                                  # (T,)
    per_token = pg_term                                                       # (T,)
    kl = None
    if ref_logprobs is not None:
        ref_minus_new = (ref_logprobs.float() - new).clamp(-_MAX_LOGRATIO, _MAX_LOGRATIO)   # (T,)
        kl = torch.exp(ref_minus_new) - ref_minus_new - 1.0                  # (T,)
        if kl_beta > 0:
            per_token = pg_term + kl_beta * kl                                # (T,)

    count = mask.sum().clamp(min=1) if normalizer is None else new.new_tensor(float(normalizer))   # ()
    loss = masked_sum(per_token, mask) / count                                # ()

    with torch.no_grad():
        sums = _sums_by_mode(mask, drop, modes, pg_term, kl,
                             clipped=clipped, dual_clipped=dual_clipped,
                             ratio=ratio, half_sq_logratio=0.5 * logratio ** 2)               # (T,) each
    return loss, (sums if return_sums else loss_metrics(sums))


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float,
                      dual_clip: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss with clip-higher and the dual clip, from (T,) ratios and advantages; also
    (T,) 0/1 floats marking where the clipped branch and where the dual clip are active."""
    pg_loss1 = -adv * ratio                                                   # (T,)
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)     # (T,)
    clipped_loss = torch.maximum(pg_loss1, pg_loss2)                          # (T,)
    dual_bound = -adv * dual_clip                                             # (T,)
    pg_loss = torch.where(adv < 0, torch.minimum(clipped_loss, dual_bound), clipped_loss)   # (T,)
    with torch.no_grad():
        clipped = (pg_loss2 > pg_loss1).float()                               # (T,)
        dual_clipped = ((adv < 0) & (clipped_loss > dual_bound)).float()      # (T,)
    return pg_loss, clipped, dual_clipped


def _sums_by_mode(mask: torch.Tensor, drop: torch.Tensor, modes: torch.Tensor, pg_term: torch.Tensor,
                  kl: torch.Tensor | None, *, clipped: torch.Tensor, dual_clipped: torch.Tensor, ratio: torch.Tensor,
                  half_sq_logratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sums `loss_metrics` turns into metrics, over all real tokens ("") and per mode ("/plain", ...); every
    argument is (T,)."""
    sums = {}
    for code, suffix in [(None, "")] + [(code, "/" + name) for code, name in MODE_NAMES.items()]:
        real = mask if code is None else mask & (modes == code)               # (T,)
        kept = real & ~drop                                                   # (T,)
        sums |= {"tokens" + suffix: real.sum().float(), "kept" + suffix: kept.sum().float(),
                 "dropped" + suffix: masked_sum(drop.float(), real),
                 "clipped" + suffix: masked_sum(clipped, kept),
                 "dual_clipped" + suffix: masked_sum(dual_clipped, kept),
                 "ratio" + suffix: masked_sum(ratio, kept),
                 "ratio_max" + suffix: torch.where(kept, ratio, torch.zeros_like(ratio)).max(),
                 "half_sq_logratio" + suffix: masked_sum(half_sq_logratio, kept),
                 "pg_loss" + suffix: masked_sum(pg_term, real)}
        if kl is not None:
            sums["kl_ref" + suffix] = masked_sum(kl, real)
    return sums


def loss_metrics(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """`policy_loss`'s metrics from its sums (those of one process, or summed over processes; "ratio_max"
    entries take the maximum); a mode without tokens is left out:
        tokens          real action tokens
        masked_frac     fraction of real tokens dropped by δ
        clip_frac       fraction of kept tokens where the clipped branch is active (pg_loss2 > pg_loss1)
        dual_clip_frac  fraction of kept tokens where the dual clip is active (A < 0, pg_loss > -A * dual_clip)
        ratio_mean, ratio_max   over kept tokens
        approx_kl       mean over kept tokens of 0.5 * (new - old)^2 (old vs new policy)
        pg_loss         token mean over real tokens of the policy-gradient term
        kl_ref          token mean over real tokens of the k3 estimate (only with ref_logprobs)
    Kept tokens are real tokens not dropped by δ; a group with none reports 0.0."""
    values = {}
    for suffix in [""] + ["/" + name for name in MODE_NAMES.values()]:
        real, kept = sums["tokens" + suffix], sums["kept" + suffix]
        if suffix and not real > 0:
            continue
        values["tokens" + suffix] = real
        values["masked_frac" + suffix] = sums["dropped" + suffix] / real.clamp(min=1)
        for name, total in (("clip_frac", "clipped"), ("dual_clip_frac", "dual_clipped"), ("ratio_mean", "ratio")):
            values[name + suffix] = sums[total + suffix] / kept.clamp(min=1)
        values["ratio_max" + suffix] = sums["ratio_max" + suffix]
        values["approx_kl" + suffix] = sums["half_sq_logratio" + suffix] / kept.clamp(min=1)
        values["pg_loss" + suffix] = sums["pg_loss" + suffix] / real.clamp(min=1)
        if "kl_ref" + suffix in sums:
            values["kl_ref" + suffix] = sums["kl_ref" + suffix] / real.clamp(min=1)
    # One device-to-host copy for all metrics.
    return dict(zip(values, torch.stack(list(values.values())).tolist()))


def _delta_drop(new_logprobs: torch.Tensor, modes: torch.Tensor, mask: torch.Tensor,
                sequence_ids: torch.Tensor | None, delta: float, delta_mode: str) -> torch.Tensor:
    """(T,) bool: OFF_POLICY tokens that get no policy-gradient term."""
    off_policy = mask & (modes == OFF_POLICY)                                 # (T,)
    if delta_mode == "none":
        return torch.zeros_like(off_policy)                                   # (T,)
    low = off_policy & (torch.exp(new_logprobs) < delta)                      # (T,)
    if delta_mode == "token":
        return low                                                            # (T,)
    turns, turn_of_token = torch.unique(sequence_ids, return_inverse=True)    # (n_turns,), (T,)
    low_per_turn = torch.zeros(len(turns), device=low.device).index_add_(0, turn_of_token, low.float())   # (n_turns,)
    return off_policy & (low_per_turn[turn_of_token] > 0)                     # (T,)


def _check_args(new_logprobs, old_logprobs, advantages, token_mask, modes, sequence_ids, ref_logprobs,
                clip_low, clip_high, dual_clip, delta, delta_mode, kl_beta, normalizer) -> None:
    if new_logprobs.ndim != 1 or new_logprobs.numel() == 0:
        raise ValueError(f"new_logprobs must be 1-D (T,) with T >= 1, got shape {tuple(new_logprobs.shape)}")
    shape = new_logprobs.shape
    named = {"old_logprobs": old_logprobs, "advantages": advantages, "token_mask": token_mask, "modes": modes}
    if sequence_ids is not None:
        named["sequence_ids"] = sequence_ids
    if ref_logprobs is not None:
        named["ref_logprobs"] = ref_logprobs
    for name, tensor in named.items():
        if tensor.shape != shape:
            raise ValueError(f"{name} must have shape {tuple(shape)} like new_logprobs, got {tuple(tensor.shape)}")
    if modes.dtype != torch.long or not torch.isin(modes, torch.tensor([PLAIN, MEMORY_ON_POLICY, OFF_POLICY],
                                                                       device=modes.device)).all():
        raise ValueError(f"modes must be a long tensor with values in {sorted(MODE_NAMES)}")
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low!r}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high!r}")
    if not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip!r}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    if delta_mode not in CHOICES["delta_mode"]:
        raise ValueError(f"delta_mode must be one of {CHOICES['delta_mode']}, got {delta_mode!r}")
    if delta_mode == "sequence" and sequence_ids is None:
        raise ValueError("sequence_ids must be given when delta_mode is 'sequence'")
    if not kl_beta >= 0.0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta!r}")
    if kl_beta > 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs must be given when kl_beta > 0")
    if normalizer is not None and not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer!r}")
