"""`make bench`'s overlap figures from metrics lines written by hand (the engine run is the benchmark)."""

import pytest

from emoji_rl.bench.step_times import balancing_padding, overlap_ratios, step_times


def line(step, rollout, update, wait, total):
    return {
        "step": step,
        "time/rollout_s": rollout,
        "time/update_s": update,
        "time/wait_rollouts_s": wait,
        "time/step_s": total,
        "reward/mean": 0.5,
    }


def test_medians_leave_out_the_warm_up_steps_whatever_their_order():
    metrics = [line(4, 5.0, 4.0, 5.0, 9.5), line(1, 60.0, 9.0, 60.0, 70.0), line(3, 4.0, 6.0, 4.0, 10.5)]
    metrics += [line(2, 30.0, 1.0, 30.0, 31.0), line(5, 6.0, 5.0, 6.0, 11.0)]
    times = step_times(metrics, warmup=2)
    assert (times.rollout, times.update, times.wait, times.step, times.steps) == (5.0, 5.0, 5.0, 10.5, 3)
    assert times.rollout_share == pytest.approx(5 / 10.5) and times.balanced()
    assert not step_times([line(3, 8.0, 1.0, 8.0, 9.0)], warmup=2).balanced()  # 89% / 11%


def test_the_two_ratios_against_lockstep_and_against_its_slower_side():
    lockstep = step_times([line(3, 4.0, 6.0, 4.0, 10.0)], warmup=2)
    ahead = step_times([line(3, 6.3, 6.1, 0.2, 6.5)], warmup=2)
    assert overlap_ratios(lockstep, ahead) == pytest.approx((0.65, 6.5 / 6.0))


def test_a_run_with_nothing_after_the_warm_up_is_an_error():
    with pytest.raises(ValueError, match="no steps after the 2 of warm-up: 2 steps"):
        step_times([line(1, 1, 1, 1, 2), line(2, 1, 1, 1, 2)], warmup=2)


def test_the_padding_where_update_meets_rollouts_on_two_lockstep_probes():
    bare = step_times([line(3, 8.0, 4.0, 8.0, 12.0)], warmup=2)
    # 100 words: update 4 -> 6 s, rollouts 8 -> 8.5 s; they close 1.5 s per 100 words, 4 s apart
    padded = step_times([line(3, 8.5, 6.0, 8.5, 14.5)], warmup=2)
    assert balancing_padding(bare, padded, probe=100, limit=1000) == 267
    assert balancing_padding(bare, padded, probe=100, limit=200) == 200
    # already update-heavy, or padding widens the gap: nothing to add
    assert balancing_padding(step_times([line(3, 4.0, 6.0, 4.0, 10.0)], warmup=2), padded, 100, 1000) == 0
    assert balancing_padding(bare, step_times([line(3, 11.0, 5.0, 11.0, 16.0)], warmup=2), 100, 1000) == 0
