"""Bootstrap intervals of mean scores: over episodes, and over seeds then episodes."""

import numpy as np

from empo2.stats import bootstrap_interval, seed_bootstrap_difference, seed_bootstrap_interval


def test_bootstrap_intervals_cover_the_mean_and_shrink_with_more_data():
    rng = np.random.default_rng(0)
    small, large = rng.normal(5, 10, 20), rng.normal(5, 10, 2000)
    low, high = bootstrap_interval(small)
    assert low < small.mean() < high
    low_large, high_large = bootstrap_interval(large)
    assert high_large - low_large < (high - low) / 5
    seeds = [rng.normal(0, 10, 20) for _ in range(3)]
    low, high = seed_bootstrap_interval(seeds)
    assert low < np.mean([s.mean() for s in seeds]) < high
    # A clear difference excludes 0; a method against itself does not.
    _, low, high = seed_bootstrap_difference([s + 30 for s in seeds], seeds)
    assert low > 0
    _, low, high = seed_bootstrap_difference(seeds, seeds)
    assert low < 0 < high


def _textbook_interval(samples, resamples=10_000):
    """The two-level bootstrap one round at a time (seeds drawn, then each chosen seed's episodes), of the
    first sample's mean minus the second's (or of the one sample's mean)."""
    rng = np.random.default_rng(1)

    def draw(groups):
        chosen = rng.integers(0, len(groups), size=len(groups))
        return np.mean([groups[c][rng.integers(0, len(groups[c]), size=len(groups[c]))].mean() for c in chosen])

    values = [draw(samples[0]) - (draw(samples[1]) if len(samples) > 1 else 0) for _ in range(resamples)]
    return np.quantile(values, 0.025), np.quantile(values, 0.975)


def test_the_bootstrap_drawn_at_once_matches_the_textbook_loop_up_to_monte_carlo_error():
    rng = np.random.default_rng(3)
    a = [rng.normal(0, 50, n) for n in (40, 7, 120)]  # seeds of unequal lengths; drawn in 4 batches
    b = [rng.normal(10, 30, n) for n in (1, 60)]
    for ours, samples in [(seed_bootstrap_interval(a), [a]), (seed_bootstrap_difference(a, b)[1:], [a, b])]:
        expected = _textbook_interval(samples)
        width = expected[1] - expected[0]
        assert np.allclose(ours, expected, atol=0.04 * width), (ours, expected)


def test_a_short_seeds_padding_never_enters_its_mean():
    low, high = seed_bootstrap_interval([np.full(1, 100.0), np.full(50, 100.0), np.full(3, 100.0)])
    assert low == high == 100.0
