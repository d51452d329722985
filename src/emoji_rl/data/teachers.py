"""Teachers for the `teacher` stage: whatever turns a target message into an emoji answer.

A teacher takes `Request`s and yields `Answer`s as they arrive, in any order. It may also yield
answers to requests of an earlier, interrupted run (the Claude batch teacher resumes its batch); the
stage keeps the first answer to each (id, attempt) and drops repeats. Validation is the stage's job:
a teacher returns the raw text, or an error when it got none.

- `offline`: `OfflineTeacher` (retrieval over emoji names by MiniLM similarity), no network.
- `openai`: any OpenAI-compatible chat server, e.g. a local vLLM, with the emoji grammar sent as the
  top-level `structured_outputs` field, so every answer parses.
- `claude-batch`: the Message Batches API (`claude_batch.py`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import httpx
from tqdm import tqdm

from emoji_rl.emoji.sender_prompts import SENDER_FIRST_TURN, SENDER_SYSTEM
from emoji_rl.errors import UserError

if TYPE_CHECKING:
    import openai
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    id: str
    attempt: int
    """1 for the first request of a prompt; a rejected answer is asked again with attempt + 1."""
    target: str


@dataclass(frozen=True)
class Answer:
    id: str
    attempt: int
    text: str | None
    """The teacher's raw answer, not yet validated; None when `error` says why there is none."""
    error: str | None = None


class Teacher(Protocol):
    name: str

    def run(self, requests: list[Request]) -> Iterator[Answer]: ...


# Few-shot examples for the LLM teachers: specific emoji, in the message's order. A test checks that
# each answer parses.
TEACHER_GUIDANCE = (
    "Pick emoji that carry this message's own content (who, what, where, when, and the feeling) in the "
    "order the message gives them, so that a reader could reconstruct it. Prefer specific emoji to "
    "generic ones, and do not repeat an emoji."
)
FEW_SHOT: tuple[tuple[str, str], ...] = (
    ("I'm so excited for our beach trip this weekend", "🤩 🏖️ 🌊 ☀️ 📅"),
    ("My cat knocked the birthday cake off the table", "🐈 🎂 💥 😱"),
    ("Can you pick up milk and eggs on the way home?", "🙏 🥛 🥚 🛒 🏠"),
    ("I failed my driving test again and I feel terrible", "🚗 📝 ❌ 😞"),
)


def teacher_system() -> str:
    return f"{SENDER_SYSTEM}\n\n{TEACHER_GUIDANCE}"


def teacher_turns(target: str) -> list[dict[str, str]]:
    """The user and assistant turns an LLM teacher sees after the system prompt: few-shot, then the target.
    The user turns are the sender's own, so the teacher answers the question the student will get."""
    turns = []
    for message, emoji in FEW_SHOT:
        turns += [
            {"role": "user", "content": SENDER_FIRST_TURN.format(target=message)},
            {"role": "assistant", "content": emoji},
        ]
    return [*turns, {"role": "user", "content": SENDER_FIRST_TURN.format(target=target)}]


class OfflineTeacherAdapter:
    """`data/offline_teacher.py` behind the `Teacher` protocol, in chunks so progress shows.

    With `min_count`, the teacher first answers every one of `all_targets` (all the prompts, not
    just those a resumed run still has to do, so a rerun keeps the same vocabulary) and from then on
    uses only the emoji those answers use at least `min_count` times (`OfflineTeacher.restrict`)."""

    name = "offline"
    _CHUNK = 64

    def __init__(
        self,
        embedder: SentenceTransformer,
        min_emoji: int,
        max_emoji: int,
        min_count: int = 0,
        all_targets: Sequence[str] = (),
    ) -> None:
        from emoji_rl.data.offline_teacher import OfflineTeacher

        self.teacher = OfflineTeacher(embedder, min_emoji=min_emoji, max_emoji=max_emoji)
        if min_count:
            chunks = tqdm(self._chunks(all_targets), desc="offline vocabulary", unit="chunk")
            try:
                kept = self.teacher.restrict((a for c in chunks for a in self.teacher.answer(c)), min_count)
            except ValueError as err:
                raise UserError(f"--vocabulary_min_count over {len(all_targets)} prompts: {err}") from err
            log.info("offline teacher: %d emoji used at least %d times in its answers", kept, min_count)

    def _chunks(self, items: Sequence[T]) -> list[Sequence[T]]:
        return [items[start : start + self._CHUNK] for start in range(0, len(items), self._CHUNK)]

    def run(self, requests: list[Request]) -> Iterator[Answer]:
        for chunk in self._chunks(requests):
            texts = self.teacher.answer([r.target for r in chunk])
            for request, text in zip(chunk, texts, strict=True):
                yield Answer(request.id, request.attempt, text)


class ConnectionWatch(httpx.HTTPTransport):
    """The transport under the openai teacher's client. The client retries a failed connection
    `max_retries` times with backoff, logging each retry without the URL or what failed: against a dead
    server, 16 requests in flight printed 136 such lines over 70 s before the error that named the URL.
    Here the first connection that fails names the server and the reason at once; until a connection
    succeeds again, the client's retry lines are dropped (`filter`, on its logger)."""

    RETRY_LOGGER = "openai._base_client"

    def __init__(self, base_url: str, max_retries: int) -> None:
        super().__init__()
        self.base_url, self.max_retries = base_url, max_retries
        self.down = False
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = super().handle_request(request)
        except httpx.ConnectError as err:
            with self._lock:
                first, self.down = not self.down, True
            if first:
                log.warning(
                    "cannot connect to the OpenAI-compatible server at %s (%s %s: %s); retrying quietly, "
                    "up to %d times per request (--max_retries), then giving up",
                    self.base_url,
                    request.method,
                    request.url,
                    err,
                    self.max_retries,
                )
            raise
        with self._lock:
            back, self.down = self.down, False
        if back:
            log.info("the OpenAI-compatible server at %s answers again", self.base_url)
        return response

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.down and record.getMessage().startswith("Retrying request"))

    @contextlib.contextmanager
    def quiet_retries(self) -> Iterator[None]:
        retries = logging.getLogger(self.RETRY_LOGGER)
        retries.addFilter(self)
        try:
            yield
        finally:
            retries.removeFilter(self)


def watched_client(base_url: str, api_key: str, max_retries: int) -> tuple[openai.OpenAI, ConnectionWatch]:
    """The openai teacher's client, and the `ConnectionWatch` it connects through."""
    import openai

    watch = ConnectionWatch(base_url, max_retries)
    http = httpx.Client(transport=watch)
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries, http_client=http), watch


def connection_failure(err: Exception) -> str:
    """What failed under the openai client's APIConnectionError ("Connection error."): refused, no host."""
    cause = err.__cause__ or err
    return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__


class OpenAITeacher:
    """Chat completions from an OpenAI-compatible server, `concurrency` at a time."""

    name = "openai"

    def __init__(
        self,
        client: openai.OpenAI,
        model: str,
        min_emoji: int,
        max_emoji: int,
        max_tokens: int,
        temperature: float,
        concurrency: int,
        watch: ConnectionWatch | None = None,
    ) -> None:
        from emoji_rl.emoji.constraint import vllm_structured_outputs

        self.client, self.model, self.watch = client, model, watch
        self.max_tokens, self.temperature, self.concurrency = max_tokens, temperature, concurrency
        self.extra_body = {
            "structured_outputs": vllm_structured_outputs(min_emoji, max_emoji),
            # Qwen3-family templates would otherwise open a <think> block the grammar cannot hold;
            # templates without the variable drop it (docs/VLLM.md §3).
            "chat_template_kwargs": {"enable_thinking": False},
        }

    def _ask(self, request: Request) -> Answer:
        import openai

        try:
            reply = self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "system", "content": teacher_system()}, *teacher_turns(request.target)],  # type: ignore[list-item]
                max_completion_tokens=self.max_tokens,
                temperature=self.temperature,
                extra_body=self.extra_body,
            )
        except openai.APIStatusError as err:
            if err.status_code in (408, 409, 429) or err.status_code >= 500:
                return Answer(request.id, request.attempt, None, f"api error: HTTP {err.status_code}")
            raise UserError(
                f"the OpenAI-compatible server refused a request: HTTP {err.status_code} {err.message}; "
                "check --model and --base_url"
            ) from err
        except openai.APITimeoutError as err:  # reachable but slow: that attempt is spent
            return Answer(request.id, request.attempt, None, f"api error: {type(err).__name__}")
        except openai.APIConnectionError as err:
            # No server, no answer: stop before every request burns its attempts on it.
            raise UserError(
                f"cannot reach the OpenAI-compatible server at {self.client.base_url} "
                f"({connection_failure(err)}, after {self.client.max_retries} retries): start it (e.g. a vLLM "
                "server) or fix --base_url; the answers so far are kept, so rerunning the same command "
                "asks only for the rest"
            ) from err
        return Answer(request.id, request.attempt, reply.choices[0].message.content or "")

    def run(self, requests: list[Request]) -> Iterator[Answer]:
        quiet = self.watch.quiet_retries() if self.watch else contextlib.nullcontext()
        with quiet, ThreadPoolExecutor(self.concurrency) as pool:
            futures = [pool.submit(self._ask, r) for r in requests]
            try:
                for future in as_completed(futures):
                    yield future.result()
            finally:
                # A fatal error (or the consumer stopping) must not wait for the queued requests.
                for future in futures:
                    future.cancel()
