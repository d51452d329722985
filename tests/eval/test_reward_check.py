"""reward-check's arithmetic on numbers worked out by hand, and one real run on the embedded models."""

from __future__ import annotations

import json

import pytest

from emoji_rl.eval.reward_check import Config, group_variance, judge_noise, main, noise_report, sign_agreement


def test_group_variance_is_the_mean_of_each_groups_population_variance() -> None:
    # [0, 2]: mean 1, variance 1; [1, 1, 4]: mean 2, variance (1 + 1 + 4) / 3 = 2
    assert group_variance([[0.0, 2.0], [1.0, 1.0, 4.0]]) == pytest.approx(1.5)


def test_judge_noise_is_half_the_mean_squared_difference() -> None:
    # differences 0.2, 0, -0.4: squares 0.04, 0, 0.16; halves 0.02, 0, 0.08; mean 0.1 / 3
    assert judge_noise([0.5, 0.3, 0.1], [0.3, 0.3, 0.5]) == pytest.approx(0.1 / 3)
    assert judge_noise([0.5, 0.3], [0.5, 0.3]) == 0.0


def test_sign_agreement_counts_replies_on_the_same_side_of_their_group_mean() -> None:
    # group 1: means 0.2 and 0.25; signs (-,+,0) vs (-,+,-): 2 of 3 agree
    # group 2: (+,-) vs (-,+): none agree
    first = [[0.1, 0.3, 0.2], [0.9, 0.1]]
    second = [[0.1, 0.5, 0.15], [0.2, 0.8]]
    assert sign_agreement(first, second) == pytest.approx(2 / 5)
    assert sign_agreement(first, first) == 1.0


def test_noise_report_of_a_deterministic_judge_has_no_noise() -> None:
    groups = [[0.1, 0.3], [0.2, 0.6, 0.4]]
    report = noise_report(groups, groups)
    assert report.noise == 0.0 and report.noise_share == 0.0 and report.sign_agreement == 1.0
    # best minus mean: 0.3 - 0.2 = 0.1 and 0.6 - 0.4 = 0.2
    assert report.best_of_group_gain == pytest.approx(0.15)
    assert report.mean_similarity == pytest.approx(0.32)


def test_a_judge_that_ignores_the_emoji_is_all_noise() -> None:
    # Both readings are independent draws of the same spread: noise equals spread in expectation.
    first = [[0.0, 1.0], [1.0, 0.0]]
    second = [[1.0, 0.0], [0.0, 1.0]]
    report = noise_report(first, second)
    assert report.spread == pytest.approx(0.25) and report.noise == pytest.approx(0.5)
    assert report.sign_agreement == 0.0


def test_too_few_targets_is_a_clear_error(tmp_path) -> None:
    data = tmp_path / "targets.jsonl"
    data.write_text(json.dumps({"target": "one message only"}) + "\n")
    from emoji_rl.errors import UserError

    with pytest.raises(UserError, match="fewer than groups=2"):
        main(Config(adapter=None, data=str(data), groups=2, judge="lexicon"))


@pytest.mark.slow
def test_reward_check_on_the_embedded_models(tmp_path) -> None:
    data = tmp_path / "targets.jsonl"
    messages = ["I love pizza and movies", "my dog is sick today", "we are going to the beach"]
    data.write_text("".join(json.dumps({"target": m}) + "\n" for m in messages))
    out = tmp_path / "check.json"
    main(Config(adapter=None, data=str(data), groups=3, group_size=3, judge_temperature=0.0, output=str(out)))
    report = json.loads(out.read_text())
    # A greedy judge reads the same emoji the same way twice.
    assert report["report"]["noise"] == 0.0 and report["report"]["sign_agreement"] == 1.0
    assert len(report["similarities"]) == 2 and [len(g) for g in report["similarities"][0]] == [3, 3, 3]
    assert report["judge"].endswith("T=0)")
