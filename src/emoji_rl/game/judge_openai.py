"""The `openai` judge: any OpenAI-compatible chat server, such as vLLM serving
Qwen/Qwen3-30B-A3B-Instruct-2507 (launch/serve_judge.sh; docs/DESIGN.md §4, docs/VLLM.md §3).

Each episode is one `/v1/chat/completions` request with `judge_messages(...)`, the judge's sampling
settings (temperature 0.3, 40 tokens) and thinking turned off per request through
`chat_template_kwargs` (templates that do not declare `enable_thinking` ignore it). Requests run
concurrently under a semaphore; the server batches them. Answers go through `clean_guess`, exactly as
the in-process judge's do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import httpx

from emoji_rl.errors import UserError
from emoji_rl.game.judge import (
    MAX_NEW_TOKENS,
    TEMPERATURE,
    Guess,
    Judge,
    JudgeInput,
    JudgeView,
    clean_guess,
    judge_messages,
)
from emoji_rl.io.endpoint import Endpoint, ServerError, request

THINKING_OFF: Mapping[str, object] = MappingProxyType({"enable_thinking": False})


class OpenAIJudge(Judge):
    """A frozen judge behind an OpenAI-compatible `/v1/chat/completions`."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        view: JudgeView = "raw",
        *,
        max_concurrency: int = 64,
        temperature: float = TEMPERATURE,
        max_tokens: int = MAX_NEW_TOKENS,
        chat_template_kwargs: Mapping[str, object] | None = THINKING_OFF,
    ) -> None:
        if max_concurrency < 1:
            raise UserError(f"max_concurrency={max_concurrency} must be >= 1 (requests in flight at once)")
        self.endpoint = endpoint
        self.model = model
        self.view: JudgeView = view
        self.max_concurrency = max_concurrency
        self.temperature = temperature
        self.max_tokens = max_tokens
        # None for servers that reject unknown fields (OpenAI's own API does).
        self.chat_template_kwargs = dict(chat_template_kwargs) if chat_template_kwargs is not None else None

    def request_body(self, episode: JudgeInput) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self.model,
            "messages": judge_messages(episode, self.view),
            "temperature": self.temperature,
            # max_completion_tokens: OpenAI's current name; vLLM reads it before the deprecated max_tokens.
            "max_completion_tokens": self.max_tokens,
        }
        if self.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        return body

    async def guess(self, episodes: Sequence[JudgeInput]) -> list[Guess]:
        gate = asyncio.Semaphore(self.max_concurrency)
        limits = httpx.Limits(max_connections=self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.endpoint.timeout_s, limits=limits) as client:
            return list(await asyncio.gather(*(self._ask(client, gate, ep) for ep in episodes)))

    async def _ask(self, client: httpx.AsyncClient, gate: asyncio.Semaphore, episode: JudgeInput) -> Guess:
        async with gate:
            try:
                response = await request(
                    client, self.endpoint, "POST", "/v1/chat/completions", self.request_body(episode)
                )
            except ServerError as err:
                if err.param == "model":
                    raise UserError(
                        f"{err}; the judge model name must be one the server was started with "
                        "(JUDGE_NAME in launch/serve_judge.sh)"
                    ) from err
                raise
        content = response.json()["choices"][0]["message"].get("content")
        return clean_guess(content if isinstance(content, str) else "")

    def describe(self) -> str:
        return f"openai({self.model} at {self.endpoint.url}, view={self.view}, T={self.temperature:g})"
