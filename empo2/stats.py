"""Intervals for scores: a mean of a few dozen episode scores is noisy, so every mean carries one.

`bootstrap_interval` resamples episodes; `seed_bootstrap_interval` resamples seeds, then
episodes within each resampled seed (two levels), for a method's mean over several runs.
"""

from __future__ import annotations

import numpy as np


def bootstrap_interval(values, *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
                       ) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values`."""
    values = np.asarray(values, dtype=float)  # (n,)
    if len(values) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)  # (resamples,)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def seed_bootstrap_interval(per_seed: list, *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
                            ) -> tuple[float, float]:
    """Two-level bootstrap interval of the mean over seeds of each seed's mean episode score.

    Resampling seeds captures run-to-run variation; resampling episodes within a seed,
    the evaluation noise of each run.
    """
    groups = [np.asarray(g, dtype=float) for g in per_seed if len(g)]
    if not groups:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.array([_resampled_mean(groups, rng) for _ in range(resamples)])  # (resamples,)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def seed_bootstrap_difference(per_seed_a: list, per_seed_b: list, *, level: float = 0.95, resamples: int = 10_000,
                              seed: int = 0) -> tuple[float, float, float]:
    """Mean of method A minus mean of method B (each a mean over seeds of per-seed mean scores),
    with the two-level bootstrap interval of that difference. Returns (difference, low, high)."""
    a = [np.asarray(g, dtype=float) for g in per_seed_a if len(g)]
    b = [np.asarray(g, dtype=float) for g in per_seed_b if len(g)]
    if not a or not b:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    differences = np.array([_resampled_mean(a, rng) - _resampled_mean(b, rng) for _ in range(resamples)])  # (resamples,)
    tail = (1 - level) / 2
    observed = float(np.mean([g.mean() for g in a]) - np.mean([g.mean() for g in b]))
    return observed, float(np.quantile(differences, tail)), float(np.quantile(differences, 1 - tail))


def _resampled_mean(groups: list[np.ndarray], rng: np.random.Generator) -> float:
    """One two-level bootstrap draw: seeds resampled, then each chosen seed's episodes; the mean of their means."""
    chosen = rng.integers(0, len(groups), size=len(groups))
    return float(np.mean([groups[c][rng.integers(0, len(groups[c]), size=len(groups[c]))].mean() for c in chosen]))
