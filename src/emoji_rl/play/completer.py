"""A frozen LLM that answers chats: the partner a game plays against (the retrieval game's judge, the
reader's sender, a test's answerer), in this process or on any OpenAI-compatible server, in free text
or under the emoji grammar.

- `HFCompleter`: a model in this process; the chats pending at once are decoded in batches
  (`decode.generate`). At temperature 0 an answer is a function of the chat, so each distinct chat
  is decoded once (up to `memo` of them): the same question is always answered the same way.
- `OpenAICompleter`: one `/v1/chat/completions` request per chat, concurrently under a semaphore,
  the server batching them (a vLLM server: docs/VLLM.md). Thinking is turned off per request through
  `chat_template_kwargs` (templates that do not declare `enable_thinking` ignore it); under the
  grammar the request carries it as vLLM's `structured_outputs`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import httpx

from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import Endpoint, ServerError, request

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


Chat = Sequence[Mapping[str, str]]
THINKING_OFF: Mapping[str, object] = MappingProxyType({"enable_thinking": False})


@dataclass(frozen=True)
class Completion:
    """How a partner answers: its sampling temperature, an answer's token budget, and the emoji
    grammar's bounds when it answers in emoji (`emoji` true)."""

    temperature: float
    max_tokens: int
    emoji: bool = False
    min_emoji: int = 2
    max_emoji: int = 8


class Completer(ABC):
    """One answer per chat, batched: built once and shared by every game of a run."""

    settings: Completion
    endpoint: Endpoint | None = None
    """The server it asks (None in process): each GRPO step logs what that server says of it."""

    @abstractmethod
    async def complete(self, chats: Sequence[Chat]) -> list[str]:
        """The answer to each chat (the assistant's next turn), in order."""

    @abstractmethod
    def describe(self, *details: str) -> str:
        """Kind and model, with `details`, for logs and reports: `hf(smollm2, view=gloss, T=0.3)`."""


def _describe(kind: str, name: str, details: Sequence[str], settings: Completion) -> str:
    grammar = ["emoji grammar"] if settings.emoji else []
    return f"{kind}({', '.join([name, *details, *grammar, f'T={settings.temperature:g}'])})"


class HFCompleter(Completer):
    """A frozen causal LM in this process, decoding `batch_size` chats at a time; an answer stops at
    its end of turn, or at the first token holding one of `stop_text`'s characters."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        name: str,
        settings: Completion,
        *,
        batch_size: int = 16,
        stop_text: str = "",
        memo: int = 100_000,
    ) -> None:
        from emoji_rl.decode.generate import Decoding, ids_containing

        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.settings = settings
        self.decoding = Decoding(
            "grammar" if settings.emoji else "none",
            settings.temperature,
            settings.max_tokens,
            batch_size,
            settings.min_emoji,
            settings.max_emoji,
            stop_ids=ids_containing(tokenizer, stop_text) if stop_text else frozenset(),
        )
        self.memo = memo
        self._answers: dict[tuple[tuple[tuple[str, str], ...], ...], str] = {}

    async def complete(self, chats: Sequence[Chat]) -> list[str]:
        if self.settings.temperature > 0:
            return await self._decode(chats)
        keys = [tuple(tuple(sorted(message.items())) for message in chat) for chat in chats]
        new = {key: chat for key, chat in zip(keys, chats, strict=True) if key not in self._answers}
        answers = await self._decode(list(new.values())) if new else []
        self._answers.update(zip(new, answers, strict=True))
        found = [self._answers[key] for key in keys]
        while len(self._answers) > self.memo:  # the oldest forgotten first
            del self._answers[next(iter(self._answers))]
        return found

    async def _decode(self, chats: Sequence[Chat]) -> list[str]:
        from emoji_rl.lm import template

        prompts = [template.chat_ids(self.tokenizer, list(chat)) for chat in chats]
        # A thread, so that other coroutines (an HTTP client, a progress bar) run while torch computes.
        return await asyncio.to_thread(self._generate, prompts)

    def _generate(self, prompts: list[list[int]]) -> list[str]:
        from emoji_rl.decode.generate import generate_from_ids

        return [reply.text for reply in generate_from_ids(self.model, self.tokenizer, prompts, self.decoding)]

    def describe(self, *details: str) -> str:
        return _describe("hf", self.name, details, self.settings)


class OpenAICompleter(Completer):
    """A frozen model behind an OpenAI-compatible `/v1/chat/completions`. `model_hint` says where the
    served names come from, for the error a wrong `model` gets."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        settings: Completion,
        *,
        max_concurrency: int = 64,
        chat_template_kwargs: Mapping[str, object] | None = THINKING_OFF,
        model_hint: str = "",
    ) -> None:
        if max_concurrency < 1:
            raise UserError(f"max_concurrency={max_concurrency} must be >= 1 (requests in flight at once)")
        self.endpoint = endpoint
        self.model = model
        self.settings = settings
        self.max_concurrency = max_concurrency
        # None for servers that reject unknown fields (OpenAI's own API does).
        self.chat_template_kwargs = dict(chat_template_kwargs) if chat_template_kwargs is not None else None
        self.model_hint = model_hint

    def request_body(self, chat: Chat) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self.model,
            "messages": [dict(message) for message in chat],
            "temperature": self.settings.temperature,
            # max_completion_tokens: OpenAI's current name; vLLM reads it before the deprecated max_tokens.
            "max_completion_tokens": self.settings.max_tokens,
        }
        if self.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        if self.settings.emoji:
            from emoji_rl.emoji.constraint import vllm_structured_outputs

            body["structured_outputs"] = vllm_structured_outputs(
                self.settings.min_emoji, self.settings.max_emoji
            )
        return body

    async def complete(self, chats: Sequence[Chat]) -> list[str]:
        gate = asyncio.Semaphore(self.max_concurrency)
        limits = httpx.Limits(max_connections=self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.endpoint.timeout_s, limits=limits) as client:
            return list(await asyncio.gather(*(self._ask(client, gate, chat) for chat in chats)))

    async def _ask(self, client: httpx.AsyncClient, gate: asyncio.Semaphore, chat: Chat) -> str:
        async with gate:
            try:
                response = await request(
                    client, self.endpoint, "POST", "/v1/chat/completions", self.request_body(chat)
                )
            except ServerError as err:
                if err.param == "model":
                    where = f" ({self.model_hint})" if self.model_hint else ""
                    raise UserError(
                        f"{err}; the model name must be one the server was started with{where}"
                    ) from err
                raise
        content = response.json()["choices"][0]["message"].get("content")
        return content if isinstance(content, str) else ""

    def describe(self, *details: str) -> str:
        return _describe("openai", f"{self.model} at {self.endpoint.url}", details, self.settings)
