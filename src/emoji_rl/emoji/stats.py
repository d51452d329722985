"""Emoji statistics over a set of replies, shared by the teacher, the GRPO rollout log, `eval-sft` and
the retrieval evaluation.

Seed 001 found SFT emoji "generic": few distinct emoji, a handful used everywhere. These numbers
measure that: distinct emoji, the entropy of their frequencies, and the share of all uses taken by
the 10 most used. Pure functions; no model, no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI, parse_message

TOP_K = 10


def emoji_counts(messages: Sequence[Sequence[str]]) -> Counter[str]:
    """How often each emoji is used across all messages."""
    return Counter(e for message in messages for e in message)


def emoji_per_message(messages: Sequence[Sequence[str]]) -> float:
    """Mean number of emoji per message; 0.0 when there are no messages."""
    return sum(map(len, messages)) / len(messages) if messages else 0.0


def distinct_emoji(messages: Sequence[Sequence[str]]) -> int:
    return len(emoji_counts(messages))


def entropy_bits(messages: Sequence[Sequence[str]]) -> float:
    """Shannon entropy (bits) of the emoji frequency distribution: log2(n) for n equally used emoji."""
    counts = emoji_counts(messages)
    total = sum(counts.values())
    # + 0.0: one emoji's entropy is -0.0, which a table prints as "-0.000".
    return -sum(c / total * math.log2(c / total) for c in counts.values()) + 0.0 if total else 0.0


def top_k_share(messages: Sequence[Sequence[str]], k: int = TOP_K) -> float:
    """Share of all emoji uses taken by the `k` most used emoji (1.0 when at most `k` are used)."""
    assert k >= 1, k
    counts = emoji_counts(messages)
    total = sum(counts.values())
    return sum(c for _, c in counts.most_common(k)) / total if total else 0.0


def repeat_share(messages: Sequence[Sequence[str]]) -> float:
    """Share of messages that use some emoji more than once ("🔉 🔉"); 0.0 when there are none."""
    return sum(len(set(m)) < len(m) for m in messages) / len(messages) if messages else 0.0


def most_common_share(items: Sequence[str]) -> tuple[str, float]:
    """The most frequent item (the first seen among ties) and the share of items equal to it: one emoji
    message a sender writes for many targets, or one guess a judge gives for many, shows up here."""
    if not items:
        return "", 0.0
    item, count = Counter(items).most_common(1)[0]
    return item, count / len(items)


@dataclass(frozen=True)
class ReplyStats:
    """Format compliance of a set of replies, and emoji statistics over the compliant ones."""

    replies: int
    compliance: float
    emoji_per_message: float
    distinct_emoji: int
    entropy_bits: float
    top10_share: float


def compliant_emoji(
    texts: Sequence[str],
    min_emoji: int = MIN_EMOJI,
    max_emoji: int = MAX_EMOJI,
    *,
    stopped: Sequence[bool] | None = None,
) -> list[tuple[str, ...] | None]:
    """Per reply, its emoji if it is compliant, else None. Compliant: the text is an emoji message
    (`parse_message(text).ok`) and the reply ended its turn (`stopped`; None: all did). A reply cut off
    by the token budget is not compliant even if its text parses: "🚆🚆🚆…" run to the budget is no message."""
    ended = [True] * len(texts) if stopped is None else list(stopped)
    assert len(ended) == len(texts), (len(ended), len(texts))
    parsed = [parse_message(t, min_emoji, max_emoji) for t in texts]
    return [p.emoji if p.ok and end else None for p, end in zip(parsed, ended, strict=True)]


def reply_stats(
    texts: Sequence[str],
    min_emoji: int = MIN_EMOJI,
    max_emoji: int = MAX_EMOJI,
    *,
    stopped: Sequence[bool] | None = None,
) -> ReplyStats:
    """Compliance (see `compliant_emoji`), then emoji statistics over the compliant replies only, since a
    reply that is not an emoji message has no well-defined emoji sequence."""
    valid = [e for e in compliant_emoji(texts, min_emoji, max_emoji, stopped=stopped) if e is not None]
    return ReplyStats(
        replies=len(texts),
        compliance=len(valid) / len(texts) if texts else 0.0,
        emoji_per_message=emoji_per_message(valid),
        distinct_emoji=distinct_emoji(valid),
        entropy_bits=entropy_bits(valid),
        top10_share=top_k_share(valid, TOP_K),
    )


# --- intervals ----------------------------------------------------------------------------------
