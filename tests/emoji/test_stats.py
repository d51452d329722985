import math

import pytest

from emoji_rl.emoji.stats import (
    compliant_emoji,
    distinct_emoji,
    emoji_counts,
    emoji_per_message,
    entropy_bits,
    most_common_share,
    repeat_share,
    reply_stats,
    top_k_share,
)

# 🍕 three times, 🎉 and 🎬 once each: 5 uses in 2 messages.
MESSAGES = [("🍕", "🎉"), ("🍕", "🎬", "🍕")]


def test_counts_length_and_distinct_by_hand():
    assert emoji_counts(MESSAGES) == {"🍕": 3, "🎉": 1, "🎬": 1}
    assert emoji_per_message(MESSAGES) == 2.5
    assert distinct_emoji(MESSAGES) == 3


def test_entropy_by_hand():
    # -(0.6 log2 0.6 + 2 * 0.2 log2 0.2) = 1.3710 bits
    assert entropy_bits(MESSAGES) == pytest.approx(1.3710, abs=1e-4)


def test_entropy_of_n_equally_used_emoji_is_log2_n():
    assert entropy_bits([("🍕", "🎉"), ("🎬", "🐱")]) == pytest.approx(2.0)
    assert entropy_bits([("🍕", "🍕")]) == 0.0
    assert f"{entropy_bits([('🍕', '🍕')]):.3f}" == "0.000"


def test_top_k_share_by_hand():
    assert top_k_share(MESSAGES, k=1) == pytest.approx(0.6)
    assert top_k_share(MESSAGES, k=10) == 1.0
    # one emoji used 9 times and 11 used once: the top 10 hold 9 + 9 of 20 uses
    eleven = ["😀", "😃", "😄", "😁", "😆", "😅", "🤣", "😂", "🙂", "🙃", "😉"]
    assert top_k_share([("🍕",) * 9, tuple(eleven)], k=10) == pytest.approx(18 / 20)


def test_repeat_share_and_most_common_share_by_hand():
    # the second message uses 🍕 twice, the first uses each emoji once
    assert repeat_share(MESSAGES) == 0.5
    assert repeat_share([("🍕",), ("🎉", "🎬")]) == 0.0
    assert most_common_share(["🧑‍🎓 🧑", "🍕 🎉", "🧑‍🎓 🧑", "🎬"]) == ("🧑‍🎓 🧑", 0.5)
    # ties go to the first seen
    assert most_common_share(["b", "a", "a", "b"]) == ("b", 0.5)


def test_no_messages_give_zeros_not_errors():
    assert emoji_per_message([]) == 0.0
    assert distinct_emoji([]) == 0
    assert entropy_bits([]) == 0.0
    assert top_k_share([]) == 0.0
    assert repeat_share([]) == 0.0
    assert most_common_share([]) == ("", 0.0)


def test_reply_stats_count_only_compliant_replies():
    stats = reply_stats(["🍕 🎉", "I love pizza 🍕", "🍕🎬🍕", "🍕"])  # the last has too few emoji
    assert stats.replies == 4
    assert stats.compliance == 0.5
    assert stats.emoji_per_message == 2.5
    assert stats.distinct_emoji == 3
    assert math.isclose(stats.entropy_bits, entropy_bits(MESSAGES))
    assert stats.top10_share == 1.0


def test_reply_stats_of_nothing():
    stats = reply_stats([])
    assert (stats.replies, stats.compliance, stats.distinct_emoji) == (0, 0.0, 0)


def test_a_reply_cut_off_by_the_token_budget_is_not_compliant():
    texts = ["🚆🚆🚆🚆", "🍕 🎉", "🍕 🎉"]
    assert compliant_emoji(texts, stopped=[False, True, False]) == [None, ("🍕", "🎉"), None]
    stats = reply_stats(texts, stopped=[False, True, False])
    assert stats.compliance == pytest.approx(1 / 3) and stats.distinct_emoji == 2
