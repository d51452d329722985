"""In-memory stand-ins for the Anthropic and OpenAI HTTP APIs, served to the real SDKs through
`httpx2.MockTransport` (the SDKs' own HTTP library), so no test reaches the network.

Tests get them from the `anthropic_api` and `openai_api` fixtures (factories: `anthropic_api(reply)`);
with `--import-mode=importlib` a test module cannot import this file."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import anthropic
import httpx2
import openai
import pytest

API_KEY = "sk-ant-test-SECRET-0123456789"
BASE = "https://api.anthropic.com"


class Crash(BaseException):
    """A kill -9 stand-in: a BaseException, so the SDKs' retry loops (which catch Exception) let it through."""


def _error(status: int, kind: str) -> httpx2.Response:
    # retry-after-ms keeps the SDK's backoff to a millisecond in tests.
    body = {"type": "error", "error": {"type": kind, "message": f"fake {kind}"}}
    return httpx2.Response(status, json=body, headers={"retry-after-ms": "1"})


def message_json(text: str) -> dict:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


class FakeAnthropic:
    """Messages and Message Batches endpoints, enough for the `prompts` and `teacher` stages.

    `statuses`: HTTP error statuses to answer the next requests with, in order (e.g. [429]).
    `reply(body)`: the text of a message for a request body (messages.create or a batch item).
    `errored`: custom ids whose batch result is `errored` the first time they are processed.
    `crash(method, path)`: True to raise `Crash` on that request (before it has any effect, or,
    for a batch create, after the batch is made, like a connection lost before the response).
    `polls`: status polls a batch stays `in_progress` for.
    """

    api_key = API_KEY
    Crash = Crash

    def __init__(self, reply: Callable[[dict], str], polls: int = 1) -> None:
        self.reply, self.polls = reply, polls
        self.statuses: list[int] = []
        self.errored: set[str] = set()
        self.crash: Callable[[str, str], bool] = lambda method, path: False
        self.calls: list[tuple[str, str]] = []
        self.created: list[list[str]] = []
        self.batches: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._clock = datetime.now(UTC)

    def crash_once(self, method: str, path: str) -> None:
        """Crash on the first `method path` request from now on, and never again."""
        fired = False

        def crash(m: str, p: str) -> bool:
            nonlocal fired
            hit = not fired and (m, p) == (method, path)
            fired = fired or hit
            return hit

        self.crash = crash

    def client(self, max_retries: int = 2) -> anthropic.Anthropic:
        http = httpx2.Client(transport=httpx2.MockTransport(self.handle))
        return anthropic.Anthropic(api_key=API_KEY, http_client=http, max_retries=max_retries)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        method, path = request.method, request.url.path
        with self._lock:
            self.calls.append((method, path))
            # The SDK sends the key (as a bearer token): the leak tests below are not vacuous.
            assert API_KEY in request.headers.get("authorization", "") + request.headers.get("x-api-key", "")
            if self.statuses:
                status = self.statuses.pop(0)
                return _error(
                    status, {429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
                )
            created_batch = method == "POST" and path == "/v1/messages/batches"
            crash = self.crash(method, path)
            if crash and not created_batch:
                raise Crash(f"{method} {path}")
            if method == "POST" and path == "/v1/messages":
                return httpx2.Response(200, json=message_json(self.reply(json.loads(request.content))))
            if created_batch:
                response = self._create(json.loads(request.content)["requests"])
                if crash:
                    raise Crash(f"{method} {path} after the batch was made")
                return response
            if method == "GET" and path == "/v1/messages/batches":
                listed = sorted(self.batches.values(), key=lambda b: b["created_at"], reverse=True)
                data = [self._batch_json(b) for b in listed]
                return httpx2.Response(
                    200, json={"data": data, "has_more": False, "first_id": None, "last_id": None}
                )
            parts = path.split("/")
            if method == "GET" and len(parts) == 5:
                return httpx2.Response(200, json=self._poll(parts[4]))
            if method == "GET" and parts[-1] == "results":
                return self._results(parts[4])
        raise AssertionError(f"unexpected request {method} {path}")

    def _create(self, requests: list[dict]) -> httpx2.Response:
        batch_id = f"msgbatch_{next(self._ids):03d}"
        self._clock += timedelta(seconds=1)
        self.created.append([r["custom_id"] for r in requests])
        self.batches[batch_id] = {
            "id": batch_id,
            "requests": requests,
            "polls": self.polls,
            "created_at": self._clock,
        }
        return httpx2.Response(200, json=self._batch_json(self.batches[batch_id]))

    def _batch_json(self, batch: dict) -> dict:
        ended = batch["polls"] <= 0
        n = len(batch["requests"])
        return {
            "id": batch["id"],
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": {"processing": 0 if ended else n, "succeeded": n if ended else 0,
                               "errored": 0, "canceled": 0, "expired": 0},
            "created_at": batch["created_at"].isoformat(),
            "expires_at": (batch["created_at"] + timedelta(days=1)).isoformat(),
            "ended_at": batch["created_at"].isoformat() if ended else None,
            "results_url": f"{BASE}/v1/messages/batches/{batch['id']}/results" if ended else None,
        }  # fmt: skip

    def _poll(self, batch_id: str) -> dict:
        batch = self.batches[batch_id]
        batch["polls"] -= 1
        return self._batch_json(batch)

    def _results(self, batch_id: str) -> httpx2.Response:
        batch = self.batches[batch_id]
        if "results" not in batch:  # fixed on first read: the API keeps the same results
            batch["results"] = []
            for r in batch["requests"]:
                if r["custom_id"] in self.errored:
                    self.errored.discard(r["custom_id"])
                    error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
                    result = {"type": "errored", "error": error}
                else:
                    result = {"type": "succeeded", "message": message_json(self.reply(r["params"]))}
                batch["results"].append({"custom_id": r["custom_id"], "result": result})
        lines = "".join(json.dumps(r) + "\n" for r in reversed(batch["results"]))  # any order
        return httpx2.Response(200, content=lines.encode(), headers={"content-type": "application/binary"})


@pytest.fixture
def no_sleep(monkeypatch):
    """Batch polling and submit backoff sleep for real; tests do not."""
    import time

    monkeypatch.setattr(time, "sleep", lambda s: None)


class FakeOpenAI:
    """`/v1/chat/completions` of an OpenAI-compatible server (vLLM); records each request body."""

    def __init__(self, reply: Callable[[dict], str]) -> None:
        self.reply = reply
        self.bodies: list[dict] = []
        self._lock = threading.Lock()

    def client(self) -> openai.OpenAI:
        http = httpx2.Client(transport=httpx2.MockTransport(self.handle))
        return openai.OpenAI(base_url="http://vllm.test/v1", api_key="EMPTY", http_client=http, max_retries=0)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        assert (request.method, request.url.path) == ("POST", "/v1/chat/completions")
        body = json.loads(request.content)
        with self._lock:
            self.bodies.append(body)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": self.reply(body)},
            "finish_reason": "stop",
        }
        return httpx2.Response(
            200,
            json={
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )


@pytest.fixture
def anthropic_api() -> type[FakeAnthropic]:
    return FakeAnthropic


@pytest.fixture
def openai_api() -> type[FakeOpenAI]:
    return FakeOpenAI
