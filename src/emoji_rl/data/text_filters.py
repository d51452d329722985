"""Which natural-language messages may become prompts: length, personal data, profanity.

`rejection_reason(text, min_words, max_words)` is None for a usable message, else a short reason that
the prompts stage counts (`"too short"`, `"personal data: email"`, `"profanity"`, ...).

Profanity uses better-profanity's word list and look-alike characters (`a` also matches `@ 4 *`), as
whole words, compiled into one regex: `profanity.contains_profanity` took 30 ms a call here, so the
258K-message corpus would have cost two hours.
"""

from __future__ import annotations

import functools
import re

# Personal data a message must not carry: it would end up in training data and model outputs.
_PERSONAL_DATA = {
    "email": re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+"),
    "url": re.compile(
        r"\b(?:https?://|www\.)\S+|\b[\w-]+\.(?:com|net|org|io|edu|gov|co|uk|me|ly|app|dev)\b", re.I
    ),
    "handle": re.compile(r"(?<![\w@])@\w{2,}"),
    # 7+ digits with separators: phone numbers; a shorter run is a year, a time or a price.
    "phone": re.compile(r"(?<!\w)\+?\d(?:[\s().-]*\d){6,}(?!\w)"),
    "street address": re.compile(
        r"\b\d+\s+(?:\w+\s+){1,3}(?:street|st|avenue|ave|road|rd|blvd|lane|ln|drive)\b", re.I
    ),
}
# Emoji, CJK and other pictographs: a target that already holds emoji makes a poor exercise.
_NON_TEXT = re.compile(r"[\u3000-\U0010ffff]")


@functools.cache
def _profanity_regex() -> re.Pattern[str]:
    from better_profanity import Profanity
    from better_profanity.utils import get_complete_path_of_file, read_wordlist

    char_map = Profanity().CHARS_MAPPING
    words = read_wordlist(get_complete_path_of_file("profanity_wordlist.txt"))

    def pattern(word: str) -> str:
        parts = []
        for ch in word.lower():
            if ch == " ":
                parts.append(r"\s+")
            elif ch in char_map:
                parts.append("[" + "".join(re.escape(v) for v in char_map[ch]) + "]")
            else:
                parts.append(re.escape(ch))
        return "".join(parts)

    # Longest first, so that a phrase wins over a word it starts with.
    alternation = "|".join(pattern(w) for w in sorted(words, key=len, reverse=True))
    return re.compile(rf"(?<![\w@$*])(?:{alternation})(?![\w@$*])", re.I)


def contains_profanity(text: str) -> bool:
    return _profanity_regex().search(text) is not None


def personal_data(text: str) -> str | None:
    """The kind of personal data `text` holds (`email`, `url`, `handle`, `phone`, ...), or None."""
    for kind, regex in _PERSONAL_DATA.items():
        if regex.search(text):
            return kind
    return None


def rejection_reason(text: str, min_words: int, max_words: int) -> str | None:
    """Why `text` cannot be a prompt, or None. Cheap checks first: most corpus messages fail on length."""
    words = len(text.split())
    if words < min_words:
        return "too short"
    if words > max_words:
        return "too long"
    if _NON_TEXT.search(text):
        return "non-text characters"
    kind = personal_data(text)
    if kind is not None:
        return f"personal data: {kind}"
    if contains_profanity(text):
        return "profanity"
    return None
