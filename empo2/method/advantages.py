"""GRPO advantages: each episode's return compared with the others of its group.

A group is the N rollouts of the same task. The advantage of episode i is
(R_i - mean(R)) / (std(R) + eps), with the unbiased standard deviation, as in the
reference release. There is no critic and no per-step credit: every action token
of every turn of an episode gets that episode's advantage.

    adv = grpo_advantages(torch.tensor([10.0, 0.0, 0.0, 30.0]))    # (N,)

(`update.TokenBatch.of` gives every action token its episode's advantage.)
"""

from __future__ import annotations

import torch


def grpo_advantages(returns: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(N,) episode returns of one group -> (N,) advantages. Equal returns give zeros."""
    if returns.ndim != 1 or returns.numel() < 2:
        raise ValueError(f"returns must be 1-D with at least 2 values, got shape {tuple(returns.shape)}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    returns = returns.float() if not returns.is_floating_point() else returns   # (N,)
    return (returns - returns.mean()) / (returns.std(unbiased=True) + eps)      # (N,)

