"""GRPO advantages: each episode's return compared with the others of its group.

A group is the N rollouts of the same task. The advantage of episode i is
(R_i - mean(R)) / (std(R) + eps), with the unbiased standard deviation, as in the
reference release. There is no critic and no per-step credit: every action token
of every turn of an episode gets that episode's advantage.

    adv = grpo_advantages(torch.tensor([10.0, 0.0, 0.0, 30.0]))    # (N,)
    token_adv = broadcast_to_tokens(adv, episode_index_of_token)     # (T,)
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


def broadcast_to_tokens(advantages: torch.Tensor, episode_index_of_token: torch.Tensor) -> torch.Tensor:
    """(N,) per-episode advantages -> (T,) per-token advantages, token t taking
    advantages[episode_index_of_token[t]]."""
    if advantages.ndim != 1:
        raise ValueError(f"advantages must be 1-D (N,), got shape {tuple(advantages.shape)}")
    if episode_index_of_token.ndim != 1 or episode_index_of_token.dtype != torch.long:
        raise ValueError("episode_index_of_token must be a 1-D long tensor (T,)")
    if episode_index_of_token.numel() and not (
        0 <= int(episode_index_of_token.min()) and int(episode_index_of_token.max()) < advantages.numel()
    ):
        raise ValueError(f"episode_index_of_token must lie in [0, {advantages.numel() - 1}]")
    return advantages[episode_index_of_token]   # (T,)
