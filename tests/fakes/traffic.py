"""The traffic our real vLLM clients make in a run, recorded request by request with the answer each
got: from the fake server (`RecordingServer`), or from a real vLLM server through a recording proxy
(`RecordingProxy`). `play_clients` drives the same clients the same way against either, so the oracle
tests can check the fake's answers against vLLM's response classes, and the engine tests the fake's
answers against the engine's own."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import httpx
from tests.fakes.vllm_server import FakeVLLMServer, Payload

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.vllm import VLLMSampler
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.io.endpoint import Endpoint
from emoji_rl.lm.template import chat_ids, stop_token_id
from emoji_rl.play.guessing import JudgeInput
from emoji_rl.play.judge import OpenAIJudge
from emoji_rl.rl.rollout.vllm import AdapterSync


@dataclass(frozen=True)
class Exchange:
    source: str
    """"ours": sent by emoji_rl's clients; "probe": sent by the test, to draw out an error answer."""
    path: str
    body: Any
    status: int
    answer: Payload


class Recorder(Protocol):
    url: str
    auth: dict[str, str]
    source: str
    exchanges: list[Exchange]


class RecordingServer(FakeVLLMServer):
    """The fake server, keeping each answer beside the request it records."""

    source = "ours"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exchanges: list[Exchange] = []

    def dispatch(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, Payload]:
        status, payload = super().dispatch(method, path, headers, raw)
        # The body parsed here, not `self.requests[-1]`: the rollout's requests arrive at once, and
        # another may be recorded between this one's answer and this line.
        body = _parse(raw.decode("utf-8", errors="replace"))
        self.exchanges.append(Exchange(self.source, path, body, status, payload))
        return status, payload


def _parse(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


class RecordingProxy:
    """A server on 127.0.0.1 that forwards every request to `upstream` and records the exchange."""

    source = "ours"

    def __init__(self, upstream: str, auth: dict[str, str]) -> None:
        self.upstream = upstream
        self.auth = auth
        self.exchanges: list[Exchange] = []
        self._client = httpx.Client(base_url=upstream, timeout=600)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> RecordingProxy:
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._client.close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

            def _forward(self, method: str) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sent = {
                    k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")
                }
                answer = proxy._client.request(method, self.path, content=raw, headers=sent)
                proxy.exchanges.append(
                    Exchange(
                        proxy.source, self.path, _parse(raw.decode()), answer.status_code, _parse(answer.text)
                    )
                )
                self.send_response(answer.status_code)
                if "content-type" in answer.headers:
                    self.send_header("Content-Type", answer.headers["content-type"])
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


def key_paths(value: Any, where: str = "") -> set[str]:
    """Every key path of a JSON value (list items as [])."""
    if isinstance(value, dict):
        return {where + "." + k for k in value} | {
            p for k, v in value.items() for p in key_paths(v, f"{where}.{k}")
        }
    if isinstance(value, list):
        return {p for v in value for p in key_paths(v, where + "[]")}
    return set()


def play_clients(
    policy: Recorder,
    judge: Recorder,
    tokenizer,
    run_dir: Path,
    save_adapter: Callable[[Path], None],
    key_env: str,
) -> list[Exchange]:
    """What emoji_rl's vLLM clients send in a run (the rollout sampler's verify and sample, the
    AdapterSync's loads and unloads, the openai judge's chat), and probes for the error answers.
    `policy` serves `policy`, `judge` serves `judge`; their key is in `key_env`."""
    endpoint = Endpoint(policy.url, api_key_env=key_env, backoff_s=0.01)
    sampler = VLLMSampler(
        endpoint, "policy", stop_token_id(tokenizer), Decoding(temperature=0.7, max_new_tokens=32)
    )
    asyncio.run(sampler.verify())
    sync = AdapterSync(sampler, run_dir, "policy", keep=1, session="7e57")
    sync.clear_stale()
    for step in range(2):
        sync.publish(step, save_adapter)
    prompts = [tuple(chat_ids(tokenizer, sender_messages(t))) for t in ("Pizza tonight?", "Beach!")]
    # a turn batch as the trainer samples it, through a copy bound to the version: one seeded request
    # per prompt, sent at once
    asyncio.run(sampler.at(1, sampler.model, seed=3).sample(prompts))
    # a free-text game's batch (Wordle): no grammar
    free = VLLMSampler(endpoint, "policy", stop_token_id(tokenizer), Decoding("none", 0.7, max_new_tokens=32))
    asyncio.run(free.sample(prompts[:1]))
    sync.clear_stale()  # unloads what is left, so the server holds no adapter of this run after it
    policy.source = "probe"
    with httpx.Client(base_url=policy.url, headers=policy.auth, timeout=600) as client:
        client.post("/v1/completions", json={"model": "nobody", "prompt": [1, 2]})
        client.post("/v1/completions", json={"model": "policy", "prompt": [-1]})
        client.post("/v1/completions", json={"model": "policy", "prompt": [1], "logprobs": 50})
        client.post("/v1/completions", json={"model": "policy", "prompt": [1] * 1100, "max_tokens": 4})
        client.post("/v1/completions", json={"model": "policy", "prompt": [1, 2], "max_tokens": 2000})
        client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp/no-adapter-here"})
        client.post("/v1/unload_lora_adapter", json={"lora_name": "never-loaded"})
    policy.source = "ours"
    oracle_judge = OpenAIJudge(Endpoint(judge.url, api_key_env=key_env), "judge", "raw")
    asyncio.run(oracle_judge.guess([JudgeInput((("🍕", "🎬"),)), JudgeInput((("🍕",), ("🍿",)), ("pizza",))]))
    return policy.exchanges + (judge.exchanges if judge is not policy else [])
