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
    (means,) = _two_level_means([groups], np.random.default_rng(seed), resamples)  # (resamples,)
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
    means_a, means_b = _two_level_means([a, b], np.random.default_rng(seed), resamples)  # (resamples,) each
    differences = means_a - means_b  # (resamples,)
    tail = (1 - level) / 2
    observed = float(np.mean([g.mean() for g in a]) - np.mean([g.mean() for g in b]))
    return observed, float(np.quantile(differences, tail)), float(np.quantile(differences, 1 - tail))


DRAWS_AT_ONCE = 1_000_000
"""Episode draws held in memory at a time (8 MB a float array): rounds are drawn in batches of this many draws."""


def _two_level_means(samples: list[list[np.ndarray]], rng: np.random.Generator, resamples: int) -> list[np.ndarray]:
    """`resamples` two-level bootstrap means of each sample (a list of per-seed score arrays): seeds resampled,
    then each chosen seed's episodes; the mean over the chosen seeds of their resampled means. One (resamples,)
    array per sample, the rounds drawn in batches (each sample's in turn) of at most DRAWS_AT_ONCE episodes."""
    sizes = [np.array([len(g) for g in groups]) for groups in samples]  # per sample: (seeds,)
    padded = [np.zeros((len(groups), n.max())) for groups, n in zip(samples, sizes)]  # (seeds, most episodes)
    for groups, scores in zip(samples, padded):
        for c, group in enumerate(groups):
            scores[c, : len(group)] = group  # each seed's scores, then zeros
    batch = max(1, DRAWS_AT_ONCE // max(scores.size for scores in padded))
    means = [[] for _ in samples]
    for start in range(0, resamples, batch):
        for s in range(len(samples)):
            means[s].append(_batch_of_means(padded[s], sizes[s], rng, min(batch, resamples - start)))
    return [np.concatenate(m) for m in means]


def _batch_of_means(padded: np.ndarray, sizes: np.ndarray, rng: np.random.Generator, rounds: int) -> np.ndarray:
    """`rounds` two-level bootstrap means of one sample, drawn at once: (rounds,). `padded` (seeds, most episodes)
    holds each seed's scores, then zeros; `sizes` (seeds,) how many are scores."""
    seeds, most = padded.shape
    chosen = rng.integers(0, seeds, size=(rounds, seeds))  # (rounds, seeds)
    chosen_sizes = sizes[chosen][..., None]  # (rounds, seeds, 1)
    episodes = (rng.random((rounds, seeds, most)) * chosen_sizes).astype(int)  # (rounds, seeds, most)
    kept = np.arange(most) < chosen_sizes  # (rounds, seeds, most): the first `size` draws of each seed
    drawn = np.where(kept, padded[chosen[..., None], episodes], 0.0)  # (rounds, seeds, most)
    return (drawn.sum(axis=-1) / chosen_sizes[..., 0]).mean(axis=-1)  # (rounds,)
