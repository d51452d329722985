"""The models behind play-web: the senders (the base model and its adapters), the judge and the
scorer, loaded once and called from the one worker thread (`web/jobs.py`); a stop cuts a model call
short at its next forward pass."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Protocol

from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI, parse_message
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.play.guessing import Guess, JudgeInput
from emoji_rl.play.judge import Judge

WARM_UP_TARGET = "See you at the beach tomorrow"


class Stopped(Exception):
    """The server is stopping: a model call in flight was cut short at its next forward pass."""


class Models(Protocol):
    """The models a game needs. Called from one worker thread at a time (`Jobs`), except
    `similarity`, which must be safe to call from request threads."""

    def write(self, sender: str, conversation: list[dict[str, str]], seed: int) -> str:
        """The sender's emoji message for a chat (system, target, corrections)."""

    def judge(self, episode: JudgeInput) -> Guess:
        """The model judge's guess of an episode's emoji."""

    def similarity(self, target: str, guess: str) -> float:
        """The training score of a guess (MiniLM cosine)."""

    def stop(self) -> None:
        """Cut short the model call in flight and any later one: the server is stopping."""


class LoadedModels:
    """The real models, loaded once: every sender's adapter on one base, the judge, the embedder."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        senders: dict[str, str | None],
        judge: Judge,
        similarity: Any,
        temperature: float,
        max_new_tokens: int,
    ) -> None:
        self.model, self.tokenizer, self.senders = model, tokenizer, senders
        self._judge, self._similarity = judge, similarity
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self._similarity_lock = threading.Lock()
        # A sender turn or a judge guess runs seconds, and minutes on a busy CPU: a stop must not
        # wait for it. Both decode step by step through the model's forward, so a check there ends
        # one within a step. An hf judge holds its own model; other judges run no torch here.
        self._stopping = threading.Event()
        for module in {id(m): m for m in (model, getattr(judge, "model", None)) if m is not None}.values():
            module.register_forward_pre_hook(self._check_stopping)

    def _check_stopping(self, module: Any, args: Any) -> None:
        if self._stopping.is_set():
            raise Stopped("play-web is stopping")

    def stop(self) -> None:
        self._stopping.set()

    def write(self, sender: str, conversation: list[dict[str, str]], seed: int) -> str:
        from emoji_rl.decode.generate import Decoding, generate_replies
        from emoji_rl.lm.adapters import active_system

        with active_system(self.model, sender, self.senders[sender]):
            decoding = Decoding(
                temperature=self.temperature,
                max_new_tokens=self.max_new_tokens,
                min_emoji=MIN_EMOJI,
                max_emoji=MAX_EMOJI,
            )
            (reply,) = generate_replies(self.model, self.tokenizer, [conversation], decoding, seed=seed)
        return reply.text

    def judge(self, episode: JudgeInput) -> Guess:
        (guess,) = asyncio.run(self._judge.guess([episode]))
        return guess

    def similarity(self, target: str, guess: str) -> float:
        with self._similarity_lock:
            return self._similarity.similarity([target], [guess])[0]

    def warm_up(self, target: str = WARM_UP_TARGET) -> dict[str, float]:
        """One turn of every sender, the judge and the scorer, before anyone plays: the first call
        compiles the emoji grammar and sets up torch's kernels (seconds on a CPU). Seconds per step."""
        times: dict[str, float] = {}
        start = time.perf_counter()
        emoji = ""
        for sender in self.senders:
            emoji = self.write(sender, sender_messages(target), seed=0)
            times[f"sender {sender}"], start = time.perf_counter() - start, time.perf_counter()
        guess = self.judge(JudgeInput((parse_message(emoji).emoji,)))
        times["judge"], start = time.perf_counter() - start, time.perf_counter()
        self.similarity(target, guess.text)
        times["similarity"] = time.perf_counter() - start
        return times
