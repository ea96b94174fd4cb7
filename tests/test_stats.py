"""Intervals, tests and verdicts of mean scores: hand-computed cases, and by simulation the share of 95%
intervals that hold the truth, for the t-intervals on seed means and for the two-level bootstrap they replaced."""

import numpy as np
import pytest
import scipy.stats

from empo2.stats import (Seeds, bootstrap_interval, contrast, contrast_interval, contrast_p, iqm_difference,
                         iqm_difference_interval, mean_interval, p_text, paired_interval, permutation_p,
                         seed_difference, seed_interval, verdict, welch_interval)

# The six final test means of notebook 04's ScienceWorld runs (issue 58), one value a seed.
SCIENCEWORLD_EMPO2, SCIENCEWORLD_GRPO = [[8.2], [8.5], [8.2]], [[7.9], [3.7], [5.75]]


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_more_data():
    rng = np.random.default_rng(0)
    small, large = rng.normal(5, 10, 20), rng.normal(5, 10, 2000)
    low, high = bootstrap_interval(small)
    assert low < small.mean() < high
    low_large, high_large = bootstrap_interval(large)
    assert high_large - low_large < (high - low) / 5


def test_seed_intervals_hold_the_mean_and_tell_a_clear_difference():
    rng = np.random.default_rng(0)
    seeds = [rng.normal(0, 10, 20) for _ in range(3)]
    mean, low, high = seed_interval(seeds)
    assert mean == pytest.approx(np.mean([s.mean() for s in seeds])) and low < mean < high
    # A clear difference excludes 0; a method against itself does not.
    _, low, high = seed_difference([s + 30 for s in seeds], seeds)
    assert low > 0
    _, low, high = seed_difference(seeds, seeds)
    assert low < 0 < high
    # Seeds without scores are left out.
    assert seed_interval(seeds + [np.zeros(0)]) == seed_interval(seeds)


def test_welch_interval_and_permutation_p_of_the_scienceworld_runs():
    """Welch's t on the six seed means: +2.52 [-2.65, +7.68] (df 2.03); an exact permutation test over the 20
    splits of six runs: p = 0.10, the smallest 3 seeds against 3 can give. The interval holds 0."""
    difference, low, high = seed_difference(SCIENCEWORLD_EMPO2, SCIENCEWORLD_GRPO)
    assert (round(difference, 2), round(low, 2), round(high, 2)) == (2.52, -2.65, 7.68)
    expected = scipy.stats.ttest_ind([8.2, 8.5, 8.2], [7.9, 3.7, 5.75], equal_var=False).confidence_interval()
    assert (low, high) == pytest.approx((expected.low, expected.high))
    p = permutation_p(SCIENCEWORLD_EMPO2, SCIENCEWORLD_GRPO)
    assert p == pytest.approx(0.10)
    assert verdict(low, high, p) == "within the noise"
    assert p_text(p) == "p = 0.10"


def test_paired_runs_give_a_paired_t_interval():
    """Three runs measured twice, their differences 2, 4 and 3: 3 ± t(2, 0.975)·1/√3 = [0.52, 5.48]. Unpaired,
    the spread between runs (10 to 33) hides the difference; paired, 3 runs all above give p = 2/8."""
    after, before = [[12.0], [24.0], [33.0]], [[10.0], [20.0], [30.0]]
    difference, low, high = seed_difference(after, before, paired=True)
    assert (difference, round(low, 2), round(high, 2)) == (3.0, 0.52, 5.48)
    assert seed_difference(after, before)[1] < 0
    assert permutation_p(after, before, paired=True) == pytest.approx(0.25)
    # Runs without scores on either side are left out, both sides alike.
    assert seed_difference(after + [[5.0]], before + [[]], paired=True) == (difference, low, high)


def test_one_seed_falls_back_to_its_episodes():
    episodes = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert seed_interval([episodes]) == pytest.approx((3.0, 3 - 2.776 / np.sqrt(2), 3 + 2.776 / np.sqrt(2)), abs=1e-3)
    # One seed each: Welch's interval over the two seeds' episodes; no permutation p.
    difference, low, high = seed_difference([episodes], [[0.0, 0.0, 1.0, 1.0]])
    expected = scipy.stats.ttest_ind(episodes, [0.0, 0.0, 1.0, 1.0], equal_var=False).confidence_interval()
    assert difference == 2.5 and (low, high) == pytest.approx((expected.low, expected.high))
    assert np.isnan(permutation_p([episodes], [[0.0, 0.0, 1.0, 1.0]]))
    assert verdict(low, high, np.nan) == "same direction, not established (one seed each: seed spread not measured)"
    # One seed against three (means 1, 2, 3, sd 1): the three seeds' spread stands for the lone one's,
    # 3 ± t(2, 0.975)·√(1/3 + 1).
    difference, low, high = seed_difference([[5.0]], [[1.0], [2.0], [3.0]])
    assert (difference, round(low, 2), round(high, 2)) == (3.0, -1.97, 7.97)
    assert permutation_p([[5.0]], [[1.0], [2.0], [3.0]]) == pytest.approx(0.5)


def test_scores_all_equal_give_a_point_and_seeds_agreeing_by_chance_do_not():
    assert seed_difference([np.full(4, 3.0)] * 3, [np.full(4, 3.0)] * 2) == (0.0, 0.0, 0.0)
    assert verdict(0.0, 0.0, 1.0) == "no difference (every score equal)"
    assert seed_difference([np.full(4, 10.0)] * 3, [np.zeros(4)] * 3) == (10.0, 10.0, 10.0)
    assert seed_interval([np.full(1, 100.0), np.full(50, 100.0), np.full(3, 100.0)]) == (100.0, 100.0, 100.0)
    # Two seeds with the same mean but episodes apart: the episodes' own noise keeps the interval open.
    _, low, high = seed_interval([[0.0, 10.0], [10.0, 0.0]])
    assert low < 0 and high > 10


def test_the_verdict_needs_the_interval_and_the_permutation_test():
    assert verdict(0.3, 4.8, 0.01) == "reproduced" and verdict(-4.8, -0.3, 0.01) == "opposite"
    assert verdict(0.3, 4.8, 0.10) == "same direction, not established"
    assert verdict(-4.8, -0.3, 0.10) == "opposite direction, not established"
    assert verdict(-0.3, 4.8, 0.01) == "within the noise"
    assert verdict(0.3, 4.8, 0.01, claim=False) == "above 0 outside the noise"
    assert verdict(0.3, 4.8, 0.10, claim=False) == "above 0, not established"
    assert p_text(0.008) == "p = 0.008" and p_text(0.0001) == "p < 0.001" and p_text(np.nan) == ""


def test_permutation_p_is_exact_for_few_splits_and_seeded_beyond():
    rng = np.random.default_rng(0)
    five, other_five = [rng.normal(10, 1, 20) for _ in range(5)], [rng.normal(0, 1, 20) for _ in range(5)]
    assert permutation_p(five, other_five) == pytest.approx(2 / 252)  # the most extreme of 252 splits
    ten, other_ten = [rng.normal(0, 1, 20) for _ in range(10)], [rng.normal(0, 1, 20) for _ in range(10)]
    assert permutation_p(ten, other_ten) == permutation_p(ten, other_ten)  # 184,756 splits: 100,000 drawn


# ------------------------------------------------------------------------------------ coverage by simulation
DRAWS = 4000
"""Draws a scenario: a true coverage of 0.95 falls below 0.93 with probability about 1e-6, and one of 0.94 (the
t-interval of one method's mean on skewed discrete scores, measured on 40,000 draws) with about 0.4%."""


def normal_scores(seed_sd: float, episode_sd: float, episodes: int):
    """Scores of `episodes` episodes a seed: a normal seed effect plus normal episode noise (true mean 0)."""
    def draw(rng, draws, seeds):  # (draws, seeds, episodes)
        return rng.normal(0, seed_sd, (draws, seeds, 1)) + rng.normal(0, episode_sd, (draws, seeds, episodes))
    return draw


def scienceworld_scores(rng, draws, seeds, episodes=20):
    """Power-component-like scores: 0, 7 (left the first room) or 13 (reached the workshop); each seed leaves
    the room with its own chance q ~ Beta(3, 6) and then reaches the workshop with its own r ~ Beta(2, 6)."""
    leaves, reaches = rng.beta(3, 6, (draws, seeds, 1)), rng.beta(2, 6, (draws, seeds, 1))
    u = rng.random((draws, seeds, episodes))
    return np.where(u < leaves * reaches, 13.0, np.where(u < leaves, 7.0, 0.0))  # (draws, seeds, episodes)


def coin_scores(rng, draws, seeds, episodes=40):
    """CoinCollector-like scores: 100 where the coin was taken, each seed with its own chance ~ Beta(6, 6)."""
    return 100.0 * (rng.random((draws, seeds, episodes)) < rng.beta(6, 6, (draws, seeds, 1)))


SCENARIOS = {  # name: (draw, the true mean of a seed's score)
    "seed sd 2.0, episode sd 3.5, 20 episodes": (normal_scores(2.0, 3.5, 20), 0.0),
    "seed sd 6.4, episode sd 30, 40 episodes": (normal_scores(6.4, 30, 40), 0.0),
    "seed sd 6.4, episode sd 45, 200 episodes": (normal_scores(6.4, 45, 200), 0.0),
    "seed sd 1.5, episode sd 3, 40 episodes": (normal_scores(1.5, 3, 40), 0.0),
    "ScienceWorld-like {0, 7, 13}, 20 episodes": (scienceworld_scores, 3 / 9 * (7 * 6 / 8 + 13 * 2 / 8)),
    "CoinCollector-like {0, 100}, 40 episodes": (coin_scores, 50.0),
}


def as_seeds(scores: np.ndarray) -> Seeds:
    """`Seeds.of` for many draws at once: scores (draws, seeds, episodes)."""
    episodes = scores.shape[-1]
    return Seeds(scores.mean(axis=-1), scores.var(axis=-1, ddof=1) / episodes,
                 np.full(scores.shape[:-1], episodes))


def covered(low, high, truth) -> float:
    return float(np.mean((low <= truth) & (truth <= high)))


def test_t_intervals_hold_their_95_percent_at_3_5_and_10_seeds():
    """Per scenario and seed count, the share of 95% intervals holding the truth: A − B (same distribution,
    difference 0) with k seeds each and 1 against k, and one method's mean; none may fall below 0.93."""
    rng = np.random.default_rng(0)
    scores = rng.normal(0, 1, (2, 3, 7))
    assert all(np.allclose(x[1], y) for x, y in zip(as_seeds(scores), Seeds.of(list(scores[1]))))
    rows, low_ones = [], []
    for name, (draw, truth) in SCENARIOS.items():
        for k in (3, 5, 10):
            a, b = as_seeds(draw(rng, DRAWS, k)), as_seeds(draw(rng, DRAWS, k))
            lone = Seeds(*(x[:, :1] for x in a))
            shares = {f"{k} vs {k}": covered(*welch_interval(a, b)[1:], 0.0),
                      f"1 vs {k}": covered(*welch_interval(lone, b)[1:], 0.0),
                      f"mean of {k}": covered(*mean_interval(a)[1:], truth)}
            rows.append(f"{name:44s} " + "  ".join(f"{label} {share:.3f}" for label, share in shares.items()))
            low_ones += [(name, label, share) for label, share in shares.items() if share < 0.93]
    print("\n" + "\n".join(rows))
    assert not low_ones, "\n".join(rows)


def test_paired_t_intervals_hold_their_95_percent():
    """The same runs measured twice (a run effect shared by both measurements, fresh episodes each time)."""
    rng = np.random.default_rng(1)
    for seed_sd, episode_sd, episodes in ((2.0, 3.5, 20), (6.4, 30, 40)):
        for runs in (3, 5, 10):
            run_effect = rng.normal(0, seed_sd, (DRAWS, runs, 1))
            first, second = (as_seeds(run_effect + rng.normal(0, episode_sd, (DRAWS, runs, episodes)))
                             for _ in range(2))
            assert covered(*paired_interval(second, first)[1:], 0.0) >= 0.93, (seed_sd, episode_sd, runs)


def two_level_bootstrap(a: np.ndarray, b: np.ndarray, rng, resamples: int = 1000, level: float = 0.95):
    """The interval the claims used before the t-intervals (`stats.seed_bootstrap_difference` until then):
    the percentile bootstrap of A's mean minus B's, each round drawing seeds, then each chosen seed's
    episodes, with replacement. a, b: (seeds, episodes) scores."""
    def means(scores):  # (resamples,)
        seeds, episodes = scores.shape
        chosen = rng.integers(0, seeds, (resamples, seeds, 1))
        drawn = rng.integers(0, episodes, (resamples, seeds, episodes))
        return scores[chosen, drawn].mean(axis=(1, 2))

    return np.quantile(means(a) - means(b), [(1 - level) / 2, (1 + level) / 2])


def test_the_two_level_bootstrap_falls_short_at_3_seeds():
    """The harness above, applied to the bootstrap: at 3 seeds a method (seed sd 2.0, episode sd 3.5, 20
    episodes a seed) its 95% intervals hold the true difference in about 87% of draws, the t-intervals in 95%+."""
    rng = np.random.default_rng(2)
    draw, truth = SCENARIOS["seed sd 2.0, episode sd 3.5, 20 episodes"]
    scores = draw(rng, 2 * 400, 3).reshape(400, 2, 3, 20)  # (draws, methods, seeds, episodes)
    bootstrap = np.array([two_level_bootstrap(a, b, rng) for a, b in scores])  # (draws, 2)
    t = welch_interval(as_seeds(scores[:, 0]), as_seeds(scores[:, 1]))
    old, new = covered(*bootstrap.T, truth), covered(*t[1:], truth)
    print(f"\n3 vs 3 seeds: two-level bootstrap {old:.3f}, t-interval {new:.3f} (400 draws)")
    assert old < 0.93 <= new


MAIN_EFFECT = [0.5, 0.5, -0.5, -0.5]
"""Memory's main effect over memory × novelty, arms (memory and novelty, memory alone, novelty alone, neither)."""
STUDY_SEEDS = [10, 5, 5, 10]
"""The CoinCollector study's seeds in those arms (EMPO², EMPO² without novelty, GRPO with novelty, GRPO)."""


def test_a_contrast_of_two_arms_is_welchs_interval_and_a_main_effect_is_hand_computed():
    rng = np.random.default_rng(3)
    arms = [[rng.normal(m, 5, 20) for _ in range(n)] for m, n in zip((4, 3, 1, 0), (4, 3, 3, 5))]
    assert contrast(arms[:2], [1, -1]) == pytest.approx(seed_difference(arms[0], arms[1]))
    means = [np.array([s.mean() for s in arm]) for arm in arms]
    estimate = 0.5 * (means[0].mean() + means[1].mean() - means[2].mean() - means[3].mean())
    variance = sum(0.25 * m.var(ddof=1) / len(m) for m in means)
    df = variance**2 / sum((0.25 * m.var(ddof=1) / len(m)) ** 2 / (len(m) - 1) for m in means)
    half = scipy.stats.t.ppf(0.975, df) * np.sqrt(variance)
    assert contrast(arms, MAIN_EFFECT) == pytest.approx((estimate, estimate - half, estimate + half))
    with pytest.raises(ValueError, match="each of at least 2 seeds"):
        contrast([arms[0], arms[1][:1]], [1, -1])


def test_contrast_p_shuffles_within_strata():
    """Arms far apart give a small p, identical arms p = 1; the main effect of memory stays small when only
    novelty differs, because shuffles keep novelty's strata apart (shuffling across them would mix in novelty)."""
    far = [[np.full(10, 50.0 + k)] for k in range(5)], [[np.full(10, 0.0 + k)] for k in range(5)]
    assert contrast_p([far[0], far[1]], [1, -1]) < 0.01
    assert contrast_p([far[1], far[1]], [1, -1]) == 1.0
    rng = np.random.default_rng(4)
    novelty_only = [[rng.normal(m, 1, 40) for _ in range(5)] for m in (20, 0, 20, 0)]  # memory changes nothing
    within = contrast_p(novelty_only, MAIN_EFFECT, strata=[[0, 2], [1, 3]])
    assert within > 0.05


def test_contrast_intervals_hold_their_95_percent_at_the_studys_seeds():
    """The main effect of memory × novelty with 10, 5, 5 and 10 seeds, and a slope over four settings with 3 seeds
    each, in the CoinCollector-like and a normal scenario: at least 0.93 of 95% intervals hold the truth (0)."""
    rng = np.random.default_rng(5)
    slope = np.array([0.0, 0.1, 0.25, 0.7])
    slope_weights = list((slope - slope.mean()) / ((slope - slope.mean()) ** 2).sum())
    for name in ("CoinCollector-like {0, 100}, 40 episodes", "seed sd 6.4, episode sd 45, 200 episodes"):
        draw, _ = SCENARIOS[name]
        main = [as_seeds(draw(rng, DRAWS, n)) for n in STUDY_SEEDS]
        trend = [as_seeds(draw(rng, DRAWS, 3)) for _ in slope]
        shares = {"main effect": covered(*contrast_interval(main, MAIN_EFFECT)[1:], 0.0),
                  "slope": covered(*contrast_interval(trend, slope_weights)[1:], 0.0)}
        print(f"\n{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in shares.items()))
        assert min(shares.values()) >= 0.93, (name, shares)


def explorer_scores(rng, draws, seeds, episodes=200):
    """Like the CoinCollector study's test (200 games, {0, 100}): most seeds win about 48% of games, and one in
    five learns to explore and wins 8 to 16 points more, so seed means are skewed by an occasional far seed."""
    chance = 0.48 + rng.normal(0, 0.015, (draws, seeds, 1)) + (rng.random((draws, seeds, 1)) < 0.2) * rng.uniform(
        0.08, 0.16, (draws, seeds, 1))
    return 100.0 * (rng.random((draws, seeds, episodes)) < chance)  # (draws, seeds, episodes)


def test_iqm_difference_is_yuens_interval_and_moves_less_with_a_far_seed():
    """Hand-computed Yuen interval for 5 seeds a side (one trimmed from each end, winsorized variances); a seed
    far above the others moves the IQM difference less than the mean's; seeds agreeing exactly give a point."""
    a, b = [50.0, 48.5, 47.0, 52.0, 64.5], [47.5, 48.0, 49.0, 47.0, 51.0]
    trimmed = [np.sort(x)[1:-1] for x in (a, b)]
    winsorized = [np.clip(x, t.min(), t.max()) for x, t in zip((a, b), trimmed)]
    d = [w.var(ddof=1) * 4 / (3 * 2) for w in winsorized]  # (n − 1) s_w² / (h (h − 1)), n = 5, h = 3
    df = sum(d) ** 2 / sum(x**2 / 2 for x in d)
    difference = trimmed[0].mean() - trimmed[1].mean()
    half = scipy.stats.t.ppf(0.975, df) * np.sqrt(sum(d))
    as_runs = lambda means: [[m] for m in means]  # noqa: E731
    assert iqm_difference(as_runs(a), as_runs(b)) == pytest.approx((difference, difference - half, difference + half))
    assert difference < np.mean(a) - np.mean(b)
    assert iqm_difference(as_runs([50, 50]), as_runs([47.5, 47.5])) == (2.5, 2.5, 2.5)
    with pytest.raises(ValueError, match="each side needs at least 2"):
        iqm_difference(as_runs(a), as_runs(b[:1]))


def test_iqm_intervals_hold_their_95_percent_at_3_5_and_10_seeds():
    """Yuen's interval of the IQM difference, two arms alike (truth 0) with 3, 5 and 10 seeds each, in a normal,
    the CoinCollector-like and the far-seed (`explorer_scores`) scenario: at least 0.93 hold the truth."""
    rng = np.random.default_rng(6)
    scenarios = {"seed sd 6.4, episode sd 45, 200 episodes": SCENARIOS["seed sd 6.4, episode sd 45, 200 episodes"][0],
                 "CoinCollector-like {0, 100}, 40 episodes": coin_scores, "one seed in five explores": explorer_scores}
    rows, low_ones = [], []
    for name, draw in scenarios.items():
        shares = {k: covered(*iqm_difference_interval(draw(rng, DRAWS, k).mean(axis=-1),
                                                      draw(rng, DRAWS, k).mean(axis=-1))[1:], 0.0) for k in (3, 5, 10)}
        rows.append(f"{name:44s} " + "  ".join(f"{k} vs {k} {share:.3f}" for k, share in shares.items()))
        low_ones += [(name, k) for k, share in shares.items() if share < 0.93]
    print("\n" + "\n".join(rows))
    assert not low_ones, "\n".join(rows)


def test_seeds_whose_means_agree_exactly_fall_back_on_their_episode_noise_despite_rounding():
    # 4 of 20 episodes in every seed: the means are 0.2 each, whose float variance is about 1e-33, not 0.
    per_seed = [np.array([1.0] * 4 + [0.0] * 16)] * 3
    mean, low, high = seed_interval(per_seed)
    assert mean == pytest.approx(0.2) and high - low > 0.1
