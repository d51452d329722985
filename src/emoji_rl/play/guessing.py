"""The guessing chat every game that guesses a message from emoji shares: what a guesser (the retrieval
game's judge, the reader) is shown of the emoji sent so far and its own earlier guesses, and how its
answer is read back as one plain sentence (`clean_guess`). No game owns it, so a game that seats a
guesser imports it from here, never from another game.

The view is what an LLM guesser is shown: `raw` (the emoji alone, the real game, for models that read
emoji) or `gloss` (each emoji followed by its name, for small models: SmolLM2-135M shown raw emoji only
echoed them back, 0.10 vs 0.10 similarity for hand-picked vs random emoji; shown glosses it wrote
sentences, 0.30 vs 0.04; issue 8).

The guesser must never answer in emoji. Its answers are stripped of emoji and the stripping is flagged
on each `Guess` (the games log the rate), rather than constraining decoding: a ban on emoji tokens would
need a grammar per engine (byte-level BPE splits emoji into fragments shared with other text), while
stripping works the same in process and on a server and still shows how often it happens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import emoji as emoji_pkg
from emoji_rl.emoji.alphabet import emoji_name

JudgeView = Literal["raw", "gloss"]

UNKNOWN = "[unknown]"

_GAME = "We play a guessing game. A friend wrote a short everyday message and sent it to you as emoji. "
JUDGE_SYSTEM = {
    "raw": _GAME + "Guess the friend's message: one plain English sentence of under 15 words that uses the "
    "meaning of every emoji. Never write emoji.",
    # "uses the words in brackets" rather than "the meaning of every emoji": SmolLM2-135M drifted less
    # from the names (similarity gap 0.317 vs 0.293 on data/samples/messages.txt, 0.158 vs 0.128 on
    # 40 chitchat messages).
    "gloss": _GAME + "Each emoji is followed by its name in brackets. Guess the friend's message: one plain "
    "English sentence of under 15 words that uses the words in brackets. Never write emoji.",
}
JUDGE_FIRST_TURN = "Emoji: {emoji}\nWhat was the message?"
JUDGE_NEXT_TURN = "Not quite. They sent more emoji to correct your guess: {emoji}\nWhat was the message?"
# Worked examples, shown before every episode as earlier turns of the chat: without them SmolLM2-135M
# (gloss view) copied the glosses back instead of writing a sentence (and with three examples of one
# shape, "This noodle soup is ...", it copied that shape). Each answer uses every emoji's name; a
# statement, a question and chat register, as in real messages. Topics stay clear of the sample data.
FEW_SHOT: tuple[tuple[tuple[str, ...], str], ...] = (
    (("🐎", "🌄", "😍"), "We rode horses in the mountains at sunrise and I loved it."),
    (("📚", "🌙", "😫"), "I read books late into the night and now I am tired."),
    (("🤔", "📺", "❓"), "I am thinking about what to watch on television, any ideas?"),
    (("🛒", "🍌", "🧀"), "Can you put bananas and cheese in the shopping cart?"),
    (("🎤", "😂"), "We sang into the microphone and laughed to tears."),
)

# Reports print this whenever the offline teacher, the gloss view or the lexicon judge is used (issue 8).
NAMES_CAVEAT = (
    "Caveat: the offline teacher picks emoji by their names, and the gloss view and lexicon judge read "
    "those same names, so cpu-profile figures flatter the pipeline; the gpu profile (Claude teacher, "
    "Qwen judge on raw emoji) has no such link."
)

# CLDR names spell skin tones inside the name ("man medium skin tone beard"); a tone says nothing
# about the message and its words would pull every people emoji toward "skin".
_SKIN_TONE = re.compile(r"\s*\b(?:light|medium-light|medium|medium-dark|dark) skin tone\b")


@dataclass
class ReaderViewConfig:
    """What a game shows the policy where it sits in the guessing chat (the reader), as a judge's view."""

    reader_view: JudgeView = field(
        default="gloss",
        metadata={
            "help": "what the reader is shown, as the judge's view: raw (the emoji alone) or gloss (each "
            "emoji with its name; SmolLM2-135M needs it, issue 8)"
        },
    )


@dataclass(frozen=True)
class JudgeInput:
    """What the judge sees of one episode: the sender's turns so far and its own earlier guesses."""

    turns: tuple[tuple[str, ...], ...]
    """The emoji of each sender turn, oldest first; at least one turn."""
    guesses: tuple[str, ...] = ()
    """The judge's cleaned guesses after each turn but the last (shown to an LLM judge as its own turns)."""

    def __post_init__(self) -> None:
        assert self.turns and len(self.guesses) == len(self.turns) - 1, (self.turns, self.guesses)


@dataclass(frozen=True)
class Guess:
    """One judge answer."""

    text: str
    """The cleaned guess: one sentence, no emoji; `[unknown]` when nothing usable was left."""
    raw: str
    """What the judge wrote, for the rollout log."""
    stripped_emoji: bool = False
    """Whether emoji had to be removed from the answer (the judge was told never to write any)."""


def plain_name(e: str) -> str:
    """The emoji's CLDR name without skin tones: `🧔🏽‍♂️` -> `man beard`, `🍕` -> `pizza`."""
    return _SKIN_TONE.sub("", emoji_name(e)).strip()


def render_turn(turn: Sequence[str], view: JudgeView) -> str:
    """A sender turn as the judge reads it: `🍕 🎬` (raw) or `🍕 (pizza) 🎬 (clapper board)` (gloss)."""
    if view == "raw":
        return " ".join(turn)
    return " ".join(f"{e} ({plain_name(e)})" for e in turn)


def judge_messages(episode: JudgeInput, view: JudgeView) -> list[dict[str, str]]:
    """The chat an LLM judge answers: each sender turn as a user turn, each earlier guess as its own."""
    messages = [{"role": "system", "content": JUDGE_SYSTEM[view]}]
    for turn, answer in FEW_SHOT:
        messages.append({"role": "user", "content": JUDGE_FIRST_TURN.format(emoji=render_turn(turn, view))})
        messages.append({"role": "assistant", "content": answer})
    for t, turn in enumerate(episode.turns):
        template = JUDGE_FIRST_TURN if t == 0 else JUDGE_NEXT_TURN
        messages.append({"role": "user", "content": template.format(emoji=render_turn(turn, view))})
        if t < len(episode.guesses):
            messages.append({"role": "assistant", "content": episode.guesses[t]})
    return messages


# --- output cleaning -------------------------------------------------------------------------------

# Characters left over from emoji the `emoji` package does not list whole (bare pictographs,
# modifiers, joiners, variation selectors), and U+FFFD from an emoji cut off by the token limit.
_EMOJI_DEBRIS = re.compile("[\u200d\ufe0e\ufe0f\u20e3\ufffd\u2600-\u27bf\u2b00-\u2bff\U0001f000-\U0001faff]")
# "The message is:", "Guess:", "My guess would be -", 'The original message was "...', "I think the
# message is that ..."; a bare "The message is about pizza" is an answer and stays.
_PREFIX = re.compile(
    r"^(?:[\w',]+\s+){0,4}?(?:message|guess|answer|translation|meaning|sentence)"
    r"(?:\s+(?:is|was|would be|could be|might be|says|reads))?"
    r"(?:\s*[:\-–—]\s*|\s+(?=[\"“'])|\s+that\s+)",
    re.IGNORECASE,
)
_MARKDOWN = "*_ "
_WRAPPERS = "\"'“”‘’`" + _MARKDOWN
_QUOTED = re.compile(r"^[\"“](.+?)[\"”]")
_SENTENCE_END = re.compile(r"(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<=[.!?])\s+")


def clean_guess(text: str) -> Guess:
    """A judge answer reduced to one plain sentence: emoji, quotes, labels and extra sentences removed."""
    stripped = _EMOJI_DEBRIS.sub("", emoji_pkg.replace_emoji(text, replace=""))
    had_emoji = stripped != text
    # Lines that only announce the answer ("Sure! Here is my guess:") are dropped; the first line
    # with words left is the answer.
    lines = [line.strip() for line in stripped.splitlines()]
    lines = [line for line in lines if re.search(r"\w", line) and not line.endswith(":")]
    cleaned = lines[0].lstrip(_MARKDOWN) if lines else ""
    while (unlabelled := _PREFIX.sub("", cleaned, count=1).lstrip(_MARKDOWN)) != cleaned:
        cleaned = unlabelled
    # '"Let's eat," said my friend.' -> the quotation is the answer.
    if quoted := _QUOTED.match(cleaned):
        cleaned = quoted.group(1)
    cleaned = _SENTENCE_END.split(cleaned.strip(_WRAPPERS), maxsplit=1)[0]
    # A glossed echo, "(pizza) (clapper board)", keeps its words; brackets (some cut off) go.
    cleaned = re.sub(r"\s+", " ", re.sub(r"[()]", " ", cleaned)).strip(_WRAPPERS).rstrip(",;:")
    if not re.search(r"[^\W\d_]", cleaned):
        cleaned = UNKNOWN
    return Guess(text=cleaned, raw=text, stripped_emoji=had_emoji)
