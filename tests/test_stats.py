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
