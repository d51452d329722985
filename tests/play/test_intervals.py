import numpy as np
import pytest

from emoji_rl.play.intervals import Interval, bootstrap_mean, paired_bootstrap, verdict

# 🍕 three times, 🎉 and 🎬 once each: 5 uses in 2 messages.
MESSAGES = [("🍕", "🎉"), ("🍕", "🎬", "🍕")]


def test_constant_differences_give_a_zero_width_interval_at_that_value():
    a = [0.9, 0.2, 0.55, 0.31]
    diff = paired_bootstrap(a, [x - 0.1 for x in a])
    assert diff.mean == pytest.approx(0.1)
    assert diff.low == pytest.approx(0.1) and diff.high == pytest.approx(0.1)


def test_two_values_resample_to_their_extremes():
    # Resampling [0, 1] twice gives mean 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% percentiles of 2000 such means are 0 and 1 (each tail holds ~500 draws, not 50).
    interval = bootstrap_mean([0.0, 1.0])
    assert (interval.mean, interval.low, interval.high) == (0.5, 0.0, 1.0)
    # success@t of one system against another on two messages: a win and a tie
    assert paired_bootstrap([1.0, 1.0], [0.0, 1.0]) == Interval(0.5, 0.0, 1.0)


def test_interval_of_a_mean_matches_the_normal_approximation():
    # 50 ones and 50 zeros: mean 0.5, standard error sqrt(0.25 / 100) = 0.05, so about 0.5 ± 1.96 x 0.05.
    interval = bootstrap_mean([1.0, 0.0] * 50, n_resamples=4000)
    assert interval.mean == 0.5
    assert interval.low == pytest.approx(0.402, abs=0.02) and interval.high == pytest.approx(0.598, abs=0.02)
    narrower = bootstrap_mean([1.0, 0.0] * 50, n_resamples=4000, confidence=0.5)  # ± 0.674 x 0.05
    assert narrower.low == pytest.approx(0.466, abs=0.015) and narrower.high == pytest.approx(
        0.534, abs=0.015
    )


def test_pairing_removes_what_the_items_share():
    # Messages differ a lot in difficulty; system a beats b by 0.05 on each, give or take 0.01.
    hard_to_easy = [i / 20 for i in range(20)]
    a = [x + 0.05 + (0.01 if i % 2 else -0.01) for i, x in enumerate(hard_to_easy)]
    paired = paired_bootstrap(a, hard_to_easy)
    assert paired.mean == pytest.approx(0.05) and 0.04 <= paired.low < 0.05 < paired.high <= 0.06
    # the same numbers as two separate means: their intervals overlap widely
    separate_a, separate_b = bootstrap_mean(a), bootstrap_mean(hard_to_easy)
    assert separate_a.low < separate_b.high


def test_intervals_are_seeded_and_one_value_has_none():
    values = [0.1, 0.7, 0.4, 0.9, 0.3]
    assert bootstrap_mean(values, seed=3) == bootstrap_mean(values, seed=3)
    assert bootstrap_mean(values, seed=3) != bootstrap_mean(values, seed=4)
    assert bootstrap_mean([0.4]) == Interval(0.4, None, None)


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_data():
    few = [0.2, 0.9, 0.4, 0.6]
    interval = bootstrap_mean(few, seed=1)
    assert interval.low < sum(few) / len(few) < interval.high
    many = bootstrap_mean(few * 25, seed=1)
    assert many.high - many.low < (interval.high - interval.low) / 2


def test_bootstrap_covers_a_known_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    intervals = [bootstrap_mean(rng.uniform(0, 1, 40).tolist(), n_resamples=500, seed=s) for s in range(200)]
    hits = sum(i.low <= 0.5 <= i.high for i in intervals)
    assert 175 <= hits <= 199, hits  # 95% nominal; the percentile bootstrap runs a little narrow at n=40


def test_a_verdict_says_where_the_interval_lies_against_zero():
    assert verdict(0.001, 0.02) == "above 0"
    assert verdict(-0.02, -0.001) == "below 0"
    assert verdict(-0.01, 0.01) == "includes 0"
    assert verdict(0.0, 0.01) == "includes 0"  # touching 0 is not above it
    assert verdict(None, None) == "includes 0"  # one value: no interval to read
