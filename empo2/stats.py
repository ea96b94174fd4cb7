"""Intervals, tests and verdicts for mean scores: a mean of a few dozen episode scores is noisy, a mean over a
few training runs (seeds) more so, so every mean carries a 95% interval and every difference a verdict.

Over seeds (`seed_interval`, `seed_difference`), each seed's mean score is one observation and the interval is
Student's t on those means: Welch's for two methods' runs, a paired t for two measurements of the same runs.
The spread of the seed means already holds the episode noise within each seed, so nothing is lost by working
on means, and at the 3-10 seeds a method gets here the t quantile is what keeps a 95% interval at 95%. The
two-level percentile bootstrap used before (seeds, then episodes within a seed, resampled) is too narrow with
few seeds. In the simulations of `tests/test_stats.py` (two methods alike, normal seed effects and episode
noise in four splits, ScienceWorld-like {0, 7, 13} and CoinCollector-like {0, 100} scores), the Welch
intervals held the true difference in 95-97% of 4,000 draws at 3, 5 and 10 seeds a method, and in 94-96% for
one seed against several; the bootstrap's held it in 87% at 3 seeds (seed sd 2, episode sd 3.5, 20
episodes a seed). Seeds that agree exactly (discrete scores can) show no spread; there their episodes' noise
stands in, so that only scores all equal give an interval of zero width.

One seed has no spread between seeds to measure; its interval is over its episodes (the unit of the t), and
callers say "1 seed". A difference is established only when its t-interval excludes 0 and an exact
permutation test of the seed means (`permutation_p`) gives p < 0.05; 3 seeds against 3 can never give that
(the smallest p over the 20 splits is 0.10), whatever the interval. `verdict` words the one rule.
`bootstrap_interval` resamples the episodes of one run (the trainer's evaluations, the index of runs).
`iqm_difference` is a second view for few seeds, where one seed far from the others moves a mean: the difference
of interquartile means with Yuen's interval (in those simulations and one with an occasional far seed, it held
the truth at 3, 5 and 10 seeds a side).
"""

from __future__ import annotations

import warnings
from math import comb
from typing import NamedTuple

import numpy as np
import scipy.stats

SIGNIFICANCE = 0.05
"""The permutation p below which a difference whose 95% interval excludes 0 counts as established."""

EXACT_SPLITS = 100_000
"""Permutation tests enumerate every split of the seeds up to this many splits, else draw this many (seeded)."""


def bootstrap_interval(values, *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
                       ) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (the episodes of one run)."""
    values = np.asarray(values, dtype=float)  # (n,)
    if len(values) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)  # (resamples,)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


class Seeds(NamedTuple):
    """What the t-intervals need of one method's runs: arrays (..., seeds), where `...` are any draws computed
    at once (none for real runs, thousands in the simulations of the tests)."""

    means: np.ndarray
    """Each seed's mean score."""
    noise: np.ndarray
    """Each seed's episode variance over its episode count: what its episodes alone put into its mean."""
    episodes: np.ndarray
    """Each seed's episode count."""

    @classmethod
    def of(cls, per_seed: list) -> Seeds:
        """From each seed's scores (seeds without scores left out)."""
        groups = [np.asarray(g, dtype=float) for g in per_seed if len(g)]
        return cls(np.array([g.mean() for g in groups]), np.array([_episode_variance(g) / len(g) for g in groups]),
                   np.array([len(g) for g in groups]))

    @property
    def count(self) -> int:
        return self.means.shape[-1]

    def mean_variance(self) -> np.ndarray:
        """The variance of one seed's mean (at least two seeds; `_spread`). (...,)"""
        return _spread(self.means, self.noise)


def _spread(means: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The sample variance of seed means (..., seeds), or where the seeds agree exactly (discrete scores can)
    and so show no spread, the noise their episodes put into a mean (`noise`, (..., seeds)): an interval of
    zero width is left to scores that are all equal. (...,)"""
    return np.where(_agree(means), noise.mean(axis=-1), means.var(axis=-1, ddof=1))


def _agree(means: np.ndarray) -> np.ndarray:
    """Whether the seed means (..., seeds) are all equal. Equality, not a zero variance: the variance of equal
    floats such as [0.2, 0.2, 0.2] can be 1e-33. (...,)"""
    return (means == means[..., :1]).all(axis=-1)


def _episode_variance(scores: np.ndarray) -> float:
    """The sample variance of one seed's episode scores (0 for a single episode: nothing measured)."""
    return float(scores.var(ddof=1)) if len(scores) > 1 else 0.0


def seed_interval(per_seed: list, level: float = 0.95) -> tuple[float, float, float]:
    """The mean over seeds of each seed's mean score, with its Student-t interval over the seed means:
    (mean, low, high). With one seed, the t-interval over its episodes: it does not measure how runs differ."""
    seeds = Seeds.of(per_seed)
    if seeds.count == 0:
        return float("nan"), float("nan"), float("nan")
    return tuple(float(x) for x in mean_interval(seeds, level))


def seed_difference(per_seed_a: list, per_seed_b: list, level: float = 0.95, paired: bool = False
                    ) -> tuple[float, float, float]:
    """Mean of method A minus mean of method B, each the mean over seeds of per-seed mean scores, with its
    95% interval: (difference, low, high).

    Welch's t-interval on the seed means, or with `paired` (the same runs measured twice, seed i of A and of
    B one run) a paired t-interval on each run's difference. One seed against several: the several seeds'
    spread stands for the lone seed's too (but not below the lone seed's own episode noise). One seed each (or one run, paired): Welch's interval over the
    two seeds' episodes, which does not measure how runs differ. Every score equal: [difference, difference].
    """
    a, b = (Seeds.of(per_seed_a), Seeds.of(per_seed_b)) if not paired else _pairs(per_seed_a, per_seed_b)
    if a.count == 0 or b.count == 0:
        return float("nan"), float("nan"), float("nan")
    return tuple(float(x) for x in (paired_interval(a, b, level) if paired else welch_interval(a, b, level)))


def _pairs(per_seed_a: list, per_seed_b: list) -> tuple[Seeds, Seeds]:
    """Both measurements of the runs that have scores in both."""
    kept = [(x, y) for x, y in zip(per_seed_a, per_seed_b, strict=True) if len(x) and len(y)]
    return Seeds.of([x for x, _ in kept]), Seeds.of([y for _, y in kept])


def mean_interval(seeds: Seeds, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`seed_interval` of one method's runs: (mean, low, high), each (...,)."""
    if seeds.count == 1:
        return _t_interval(seeds.means[..., 0], [(seeds.noise[..., 0], seeds.episodes[..., 0] - 1)], level)
    return _t_interval(seeds.means.mean(axis=-1), [(seeds.mean_variance() / seeds.count, seeds.count - 1)], level)


def welch_interval(a: Seeds, b: Seeds, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`seed_difference` of two methods' runs: (difference, low, high), each (...,)."""
    difference = a.means.mean(axis=-1) - b.means.mean(axis=-1)  # (...,)
    if a.count > 1 and b.count > 1:
        parts = [(a.mean_variance() / a.count, a.count - 1), (b.mean_variance() / b.count, b.count - 1)]
    elif a.count == b.count == 1:  # episodes as the units: not an interval over seeds
        parts = [(a.noise[..., 0], a.episodes[..., 0] - 1), (b.noise[..., 0], b.episodes[..., 0] - 1)]
    else:  # the several seeds' spread stands for the lone seed's too, which is at least its episodes' noise
        several, lone = (a, b) if a.count > 1 else (b, a)
        spread = several.mean_variance()  # (...,)
        parts = [(spread / several.count + np.maximum(spread, lone.noise[..., 0]), several.count - 1)]
    return _t_interval(difference, parts, level)


def paired_interval(a: Seeds, b: Seeds, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`seed_difference` of two measurements of the same runs (seed i of `a` and of `b` one run):
    (difference, low, high), each (...,)."""
    if a.count == 1:
        return welch_interval(a, b, level)
    differences = a.means - b.means  # (..., runs)
    variance = _spread(differences, a.noise + b.noise)  # (...,)
    return _t_interval(differences.mean(axis=-1), [(variance / a.count, a.count - 1)], level)


def _t_interval(estimate, parts: list[tuple], level: float):
    """estimate ± t·se, where se² sums the parts' variances and t has Welch-Satterthwaite's degrees of freedom
    from the parts' own (a part: (variance, degrees of freedom)). A variance of 0 gives [estimate, estimate];
    a part with variance but no degrees of freedom, NaN bounds."""
    variance = sum(v for v, _ in parts)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = variance**2 / sum(np.where(v > 0, v**2 / np.asarray(f, dtype=float), 0.0) for v, f in parts)
        half = scipy.stats.t.ppf(0.5 + level / 2, df) * np.sqrt(variance)
    half = np.where(variance > 0, half, 0.0)
    return estimate, estimate - half, estimate + half


def contrast(per_seed_arms: list[list], weights: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """A linear contrast of several arms' means, Σ w_i · (arm i's mean over its seeds of each seed's mean score),
    with its 95% t-interval: (estimate, low, high). The standard error sums w_i² s_i² / n_i over the arms, and t
    has Welch-Satterthwaite's degrees of freedom (for two arms and weights +1, −1: `seed_difference`). A main
    effect of a 2 × 2 design is ½(A + B) − ½(C + D); a trend over settings x_i, the slope of the arms' means on
    x_i, has weights (x_i − x̄) / Σ(x_j − x̄)². Every arm needs two seeds."""
    arms = [Seeds.of(per_seed) for per_seed in per_seed_arms]
    if len(arms) != len(weights) or any(arm.count < 2 for arm in arms):
        raise ValueError(f"contrast: {len(weights)} weights for {len(arms)} arms, each of at least 2 seeds")
    return tuple(float(x) for x in contrast_interval(arms, weights, level))


def contrast_interval(arms: list[Seeds], weights: list[float], level: float = 0.95):
    """`contrast` of arms given as `Seeds`: (estimate, low, high), each (...,)."""
    estimate = sum(w * arm.means.mean(axis=-1) for w, arm in zip(weights, arms))
    parts = [(w**2 * arm.mean_variance() / arm.count, arm.count - 1) for w, arm in zip(weights, arms) if w]
    return _t_interval(estimate, parts, level)


IQM_TRIM = 0.25
"""The share of seeds cut from each end for the interquartile mean (rliable's IQM is `scipy.stats.trim_mean` at
0.25): the lowest and highest ⌊0.25·n⌋ seed means go, so 3 seeds keep all 3, 5 keep 3, 10 keep 6."""


def interquartile_mean(seed_means: np.ndarray) -> np.ndarray:
    """The interquartile mean of seed means (..., seeds), cut by `IQM_TRIM` at each end. (...,)"""
    return scipy.stats.trim_mean(seed_means, IQM_TRIM, axis=-1)


def iqm_difference_interval(a_means: np.ndarray, b_means: np.ndarray, level: float = 0.95):
    """A's interquartile mean of seed means minus B's, with Yuen's 95% interval (Welch's t on the trimmed means,
    winsorized variances; `scipy.stats.ttest_ind(trim=0.25)`): (difference, low, high), each (...,) from seed
    means (..., seeds). At least 2 seeds a side; where both arms' seeds each agree exactly, [difference,
    difference]. A view that a seed far from the others moves less than the mean; its coverage at 3, 5 and 10
    seeds is measured in `tests/test_stats.py`."""
    a_means, b_means = np.asarray(a_means, dtype=float), np.asarray(b_means, dtype=float)
    difference = interquartile_mean(a_means) - interquartile_mean(b_means)  # (...,)
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy's on seeds that agree exactly: handled below
        bounds = scipy.stats.ttest_ind(a_means, b_means, axis=-1, equal_var=False, trim=IQM_TRIM
                                       ).confidence_interval(level)
    agree = _agree(a_means) & _agree(b_means)
    return difference, np.where(agree, difference, bounds.low), np.where(agree, difference, bounds.high)


def iqm_difference(per_seed_a: list, per_seed_b: list, level: float = 0.95) -> tuple[float, float, float]:
    """`iqm_difference_interval` of two methods' runs, given as each seed's scores: (difference, low, high)."""
    a, b = Seeds.of(per_seed_a), Seeds.of(per_seed_b)
    if a.count < 2 or b.count < 2:
        raise ValueError(f"iqm_difference: {a.count} and {b.count} seeds; each side needs at least 2")
    return tuple(float(x) for x in iqm_difference_interval(a.means, b.means, level))


def contrast_p(per_seed_arms: list[list], weights: list[float], strata: list[list[int]] | None = None,
               draws: int = 20_000, seed: int = 0) -> float:
    """Two-sided p of a permutation test of `contrast`: the seed means are shuffled among the arms of each
    stratum (a list of arm indices; default one stratum of every arm), keeping the arms' sizes, `draws` times
    from a fixed seed, and p is the share of shuffles whose contrast is at least as far from 0 as the observed
    (counting the observed one). Strata keep what the null leaves free: for the memory main effect of memory ×
    novelty, the arms with the novelty bonus are one stratum and those without another."""
    means = [Seeds.of(per_seed).means for per_seed in per_seed_arms]
    strata = strata or [list(range(len(means)))]
    weights = np.asarray(weights, dtype=float)
    observed = abs(sum(w * m.mean() for w, m in zip(weights, means)))
    rng = np.random.default_rng(seed)
    totals = np.zeros(draws)  # (draws,)
    for stratum in strata:
        pooled = np.concatenate([means[i] for i in stratum])  # (seeds of the stratum,)
        shuffled = rng.permuted(np.broadcast_to(pooled, (draws, len(pooled))), axis=1)  # (draws, seeds)
        start = 0
        for i in stratum:
            totals += weights[i] * shuffled[:, start : start + len(means[i])].mean(axis=1)
            start += len(means[i])
    extreme = np.abs(totals) >= observed - 1e-12 * max(1.0, observed)
    return float((1 + extreme.sum()) / (1 + draws))


def permutation_p(per_seed_a: list, per_seed_b: list, paired: bool = False) -> float:
    """Two-sided p of a permutation test of A's mean seed score minus B's: over every split of the seeds into
    groups of A's and B's sizes, or with `paired` (the same runs measured twice) every swap within a run.
    Exact up to `EXACT_SPLITS` splits, else that many drawn with a fixed seed. NaN where no split can differ
    (one seed each, or one run)."""
    a, b = (Seeds.of(per_seed_a), Seeds.of(per_seed_b)) if not paired else _pairs(per_seed_a, per_seed_b)
    nothing_to_permute = a.count < 2 if paired else a.count == 0 or b.count == 0 or a.count == b.count == 1
    if nothing_to_permute:
        return float("nan")
    if not paired and min(a.count, b.count) == 1:
        return _lone_seed_p(a.means, b.means)
    splits = 2**a.count if paired else comb(a.count + b.count, a.count)
    result = scipy.stats.permutation_test(
        (a.means, b.means), _difference_of_means, permutation_type="samples" if paired else "independent",
        vectorized=True, n_resamples=EXACT_SPLITS, rng=np.random.default_rng(0) if splits > EXACT_SPLITS else None)
    return float(result.pvalue)


def _lone_seed_p(a: np.ndarray, b: np.ndarray) -> float:
    """`permutation_p` where one side has a single seed (scipy wants two a side): each seed in turn is the lone
    one, and the p is scipy's two-sided one, twice the smaller tail, at most 1."""
    pooled = np.concatenate([a, b])  # (seeds,)
    lone_minus_rest = pooled - (pooled.sum() - pooled) / (len(pooled) - 1)  # (seeds,): each split's A − B, signed
    splits = lone_minus_rest if len(a) == 1 else -lone_minus_rest  # (seeds,)
    observed = splits[0 if len(a) == 1 else -1]
    tolerance = 1e-12 * max(1.0, abs(observed))  # splits equal to the observed one up to rounding count as equal
    tail = min(np.mean(splits >= observed - tolerance), np.mean(splits <= observed + tolerance))
    return float(min(1.0, 2 * tail))


def _difference_of_means(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    return a.mean(axis=axis) - b.mean(axis=axis)


VERDICTS = {  # outcome: (a claim's wording, the paper's side above 0; a neutral wording)
    "every score equal": ("no difference (every score equal)", "no difference: every score equal"),
    "within the noise": ("within the noise", "within the noise"),
    "above": ("reproduced", "above 0 outside the noise"),
    "below": ("opposite", "below 0 outside the noise"),
    "above, not established": ("same direction, not established", "above 0, not established"),
    "below, not established": ("opposite direction, not established", "below 0, not established"),
}


def verdict(low: float, high: float, p: float, claim: bool = True) -> str:
    """What a difference's 95% interval and permutation p say, by one rule: within the noise where the interval
    holds 0; established (a claim "reproduced" or "opposite") where it excludes 0 and p < `SIGNIFICANCE`;
    else, the interval excluding 0, "not established", with "(one seed each: ...)" where p is NaN (the interval
    is over episodes). `claim`: worded for a claim of the paper (A − B above 0), else neutrally (above, below 0)."""
    if low == high == 0:
        outcome = "every score equal"
    elif low <= 0 <= high:
        outcome = "within the noise"
    else:
        outcome = "above" if low > 0 else "below"
        if not p < SIGNIFICANCE:
            outcome += ", not established"
    words = VERDICTS[outcome][0 if claim else 1]
    if outcome.endswith("not established") and np.isnan(p):
        words += " (one seed each: seed spread not measured)"
    return words


def p_text(p: float) -> str:
    """"p = 0.10", "p = 0.008", "p < 0.001"; "" for NaN."""
    if np.isnan(p):
        return ""
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}" if p < 0.01 else f"p = {p:.2f}"
