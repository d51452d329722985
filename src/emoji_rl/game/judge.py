"""The frozen judge of the retrieval game (docs/DESIGN.md §4): it sees the sender's emoji turns and its own
earlier guesses, never the target, and answers with one plain sentence.

Kinds:
- `lexicon`: no LLM; the guess is the names of the emoji sent so far. Deterministic and fast: for
  tests, for the cpu demo when time is short, and as the floor any LLM judge should beat.
- `hf`: a frozen causal LM in this process, batched decoding.
- `openai` (lands with issue 5): any OpenAI-compatible server. It subclasses `Judge`, sends
  `judge_messages(...)` to `/v1/chat/completions` with the sampling settings below under a
  semaphore, and passes each answer through `clean_guess`; `Judge.guess` is async for its sake.

The view is what an LLM judge is shown: `raw` (the emoji alone, the real game, for judges that read
emoji) or `gloss` (each emoji followed by its name, for small judges: SmolLM2-135M shown raw emoji only
echoed them back, 0.10 vs 0.10 similarity for hand-picked vs random emoji; shown glosses it wrote
sentences, 0.30 vs 0.04; issue 8).

The LLM judge must never answer in emoji. Its answers are stripped of emoji and the stripping is
flagged on each `Guess` (the game logs the rate), rather than constraining decoding: a ban on emoji
tokens would need a grammar per judge engine (byte-level BPE splits emoji into fragments shared with
other text), while stripping works the same for `hf` and `openai` and still shows how often it happens.
"""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import emoji as emoji_pkg
from emoji_rl.decode.generate import generate_from_ids, ids_containing
from emoji_rl.emoji.alphabet import emoji_name
from emoji_rl.lm import template

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

JudgeKind = Literal["lexicon", "hf", "openai"]
JudgeView = Literal["raw", "gloss"]

UNKNOWN = "[unknown]"
TEMPERATURE = 0.3
MAX_NEW_TOKENS = 40
BATCH_SIZE = 16  # hf judge: episodes per generate call
# Distinct inputs a greedy hf judge remembers its guess for (the oldest forgotten first): a 2,560-episode
# GRPO run of SmolLM2 senders sent the same emoji 38% of the time, an evaluation of five systems 37%.
MEMO_SIZE = 100_000
# The first sentence is the answer (`clean_guess` drops the rest): stopping at the first token that
# ends one cut a row from 40 generated tokens to about 11.
SENTENCE_ENDS = ".!?\n"

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


class Judge(ABC):
    """A frozen guesser, built once and passed to the game; batched so that one call serves B x G episodes."""

    @abstractmethod
    async def guess(self, episodes: Sequence[JudgeInput]) -> list[Guess]:
        """One guess per episode, in order."""

    @abstractmethod
    def describe(self) -> str:
        """Kind, view and model, for logs and reports."""


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


# --- judges ----------------------------------------------------------------------------------------


class LexiconJudge(Judge):
    """The guess is the names of every distinct emoji sent so far, in order: `pizza, clapper board`."""

    async def guess(self, episodes: Sequence[JudgeInput]) -> list[Guess]:
        return [self._names(episode) for episode in episodes]

    @staticmethod
    def _names(episode: JudgeInput) -> Guess:
        names = dict.fromkeys(plain_name(e) for turn in episode.turns for e in turn)
        text = ", ".join(names) or UNKNOWN
        return Guess(text=text, raw=text)

    def describe(self) -> str:
        return "lexicon"


class HFJudge(Judge):
    """A frozen causal LM in this process; all pending episodes are decoded in batches
    (`emoji_rl.decode.generate`), the judge prompt's system message and examples read once per batch."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        view: JudgeView,
        name: str,
        batch_size: int = BATCH_SIZE,
        temperature: float = TEMPERATURE,
        max_new_tokens: int = MAX_NEW_TOKENS,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.view = view
        self.name = name
        self.batch_size = batch_size
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.sentence_ends = ids_containing(tokenizer, SENTENCE_ENDS)
        self._memo: dict[JudgeInput, Guess] = {}

    async def guess(self, episodes: Sequence[JudgeInput]) -> list[Guess]:
        """At temperature 0 the guess is a function of what the judge sees, so each distinct input is
        decoded once per judge (up to MEMO_SIZE of them): the same emoji always read the same way."""
        if self.temperature > 0:
            return await self._decode(episodes)
        new = list(dict.fromkeys(ep for ep in episodes if ep not in self._memo))
        for episode, guess in zip(new, await self._decode(new) if new else [], strict=True):
            self._memo[episode] = guess
        answers = [self._memo[ep] for ep in episodes]
        while len(self._memo) > MEMO_SIZE:
            del self._memo[next(iter(self._memo))]
        return answers

    async def _decode(self, episodes: Sequence[JudgeInput]) -> list[Guess]:
        prompts = [template.chat_ids(self.tokenizer, judge_messages(ep, self.view)) for ep in episodes]
        # A thread, so that other coroutines (an HTTP sender, a progress bar) run while torch computes.
        answers = await asyncio.to_thread(self._generate, prompts)
        return [clean_guess(answer) for answer in answers]

    def _generate(self, prompts: list[list[int]]) -> list[str]:
        replies = generate_from_ids(
            self.model,
            self.tokenizer,
            prompts,
            constraint="none",
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size,
            stop_ids=self.sentence_ends,
        )
        return [reply.text for reply in replies]

    def describe(self) -> str:
        return f"hf({self.name}, view={self.view}, T={self.temperature:g})"
