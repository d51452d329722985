"""The emoji alphabet and the message parser; the grammar is built from the same alphabet, so the
validator and the constrained decoder never disagree.

The alphabet is every fully-qualified RGI emoji in the `emoji` package (ZWJ sequences, flags and
skin tones included) minus what lets ASCII or text through: keycaps (`0-9 # *` + U+20E3), symbols
whose base is a Latin-1, punctuation, letterlike or arrow character (`©️ ‼️ ™️ ↔️`), and enclosed
letters (`Ⓜ️ 🅰️`).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass

import emoji as emoji_pkg

MIN_EMOJI = 2
MAX_EMOJI = 8
SEPARATOR = " "
_KEYCAP = "\u20e3"
_LETTERLIKE_BELOW = 0x2300  # Latin-1, General Punctuation, Letterlike Symbols, Arrows
_ENCLOSED_LETTERS = frozenset({"Ⓜ️", "🅰️", "🅱️", "🅾️", "🅿️", "〰️"})


def _curated() -> tuple[str, ...]:
    fully_qualified = emoji_pkg.STATUS["fully_qualified"]
    kept = [
        e
        for e, data in emoji_pkg.EMOJI_DATA.items()
        if data["status"] == fully_qualified
        and _KEYCAP not in e
        and ord(e[0]) >= _LETTERLIKE_BELOW
        and e not in _ENCLOSED_LETTERS
    ]
    return tuple(sorted(kept))


ALPHABET: tuple[str, ...] = _curated()
_ALPHABET_SET = frozenset(ALPHABET)
_LONGEST = max(map(len, ALPHABET))


def random_answers(lengths: Sequence[int], seed: int) -> list[str]:
    """Uniformly random alphabet emoji, no repeat within an answer, one answer per requested length:
    the floor a judge and a sender are measured against (judge-check, eval-retrieval)."""
    rng = random.Random(seed)
    return [SEPARATOR.join(rng.sample(ALPHABET, n)) for n in lengths]


@functools.cache
def emoji_name(e: str) -> str:
    """The CLDR short name, as the `emoji` package spells it: `🍕` -> `pizza`."""
    return emoji_pkg.EMOJI_DATA[e]["en"].strip(":").replace("_", " ")


def gloss(e: str) -> str:
    """An emoji followed by its name, the way a small judge is shown it: `🍕 (pizza)`."""
    return f"{e} ({emoji_name(e)})"


@functools.cache
def keywords(e: str) -> tuple[str, ...]:
    """The CLDR name and the package's aliases, as plain words, for retrieval by meaning."""
    data = emoji_pkg.EMOJI_DATA[e]
    names = [data["en"], *data.get("alias", [])]
    return tuple(dict.fromkeys(n.strip(":").replace("_", " ") for n in names))


@dataclass(frozen=True)
class ParseResult:
    """The emoji of a valid message, or why the text is not one (`reason`, at `position` if local)."""

    emoji: tuple[str, ...]
    reason: str | None = None
    position: int | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


def _match_at(text: str, i: int) -> str | None:
    # Longest match: no alphabet entry is the concatenation of others (a test checks), so the
    # longest match is the only way a valid message can split.
    for length in range(min(_LONGEST, len(text) - i), 0, -1):
        if text[i : i + length] in _ALPHABET_SET:
            return text[i : i + length]
    return None


def _describe(ch: str) -> str:
    return f"{ch!r} (U+{ord(ch):04X})"


def parse_message(text: str, min_emoji: int = MIN_EMOJI, max_emoji: int = MAX_EMOJI) -> ParseResult:
    """Split `text` into alphabet emoji, optionally separated by single spaces, and check the count.

    Exactly the language of the decoding grammar: no leading, trailing or double spaces, nothing
    but alphabet emoji, between `min_emoji` and `max_emoji` of them.
    """
    found: list[str] = []
    i = 0
    while i < len(text):
        if found and text[i] == SEPARATOR:
            if i + 1 == len(text):
                return ParseResult(tuple(found), f"trailing space at position {i}", i)
            if text[i + 1] == SEPARATOR:
                return ParseResult(tuple(found), f"two spaces in a row at position {i}", i)
            i += 1
        match = _match_at(text, i)
        if match is None:
            return ParseResult(tuple(found), f"non-emoji character {_describe(text[i])} at position {i}", i)
        found.append(match)
        i += len(match)
    if len(found) < min_emoji:
        return ParseResult(tuple(found), f"too few emoji: {len(found)} < {min_emoji}")
    if len(found) > max_emoji:
        return ParseResult(tuple(found), f"too many emoji: {len(found)} > {max_emoji}")
    return ParseResult(tuple(found))
