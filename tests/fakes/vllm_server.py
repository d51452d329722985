"""A fake vLLM 0.33 OpenAI-compatible server on 127.0.0.1, for contract tests (docs/VLLM.md §8).

It validates requests as vLLM does (auth, routes, prompt shapes, vocabulary bounds, logprobs cap,
structured outputs, model names, lengths, the LoRA endpoints and their errors), answers with every
key vLLM sends, nulls included, and generates for real with `FakeLM` under the requested grammar.
Every request is recorded, so tests assert on the exact bodies a client sent. This file holds the
HTTP side, auth, routes, readiness and the LoRA endpoints; completions and chat are in vllm_api.py.

Its /metrics page has vLLM's prefix-cache counters and load gauges, which a GRPO step logs
(engine_stats.py), and is answered while a request generates, as vLLM's API server answers it.

Readiness as in vLLM (§5): the socket is bound at `start()` but listens only `ready_after` seconds
later (None: never), so connections are refused until then and `/health` then answers 200.

    with FakeVLLMServer(FakeLM(tokenizer), served_model_names=("policy",)) as server:
        httpx.post(server.url + "/v1/completions", headers=server.auth, json={...})
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import torch
from tests.fakes.engine_stats import EngineStats
from tests.fakes.fake_lm import FakeLM, LogprobsMode
from tests.fakes.vllm_api import Adapter, JSONBody, OpenAIAPI, Reject, bad_field, default_chat_reply, error

AUTH_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
ENGINE_ROUTES = ("/v1/completions", "/v1/chat/completions")
# 0.33 hides the folder of a missing adapter under these roots (serve/exception_handling/utils.py).
HIDDEN_PATH_ROOTS = ("/tmp", "/home", "/root", "/Users", "/var", "/mnt", "/data")

Payload = JSONBody | str | None  # JSON, plain text (LoRA success), or an empty body (/health)


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    """Lower-cased names."""
    body: Any
    """Parsed JSON, or the raw text when the body is not JSON."""


class FakeVLLMServer(OpenAIAPI):
    def __init__(
        self,
        lm: FakeLM,
        *,
        served_model_names: Sequence[str] = ("policy",),
        api_key: str | None = "test-key",
        runtime_lora: bool = True,
        max_model_len: int = 2048,
        max_logprobs: int = 20,
        max_lora_rank: int = 64,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        length_rule: Literal["0.33", "0.22"] = "0.33",
        ready_after: float | None = 0.0,
        seed: int = 0,
        chat_reply: Callable[[Sequence[JSONBody]], str] = default_chat_reply,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        assert served_model_names, "a server serves at least one name"
        self.lm = lm
        self.served = tuple(served_model_names)
        self.api_key = api_key
        self.runtime_lora = runtime_lora
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        self.max_lora_rank = max_lora_rank
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self.length_rule = length_rule
        self.ready_after = ready_after
        self.chat_reply = chat_reply
        self.requests: list[Recorded] = []
        self.max_in_flight = 0
        """Most requests open at once (each waits for the lock while the one before is answered)."""
        self._in_flight = 0
        self.adapters: dict[str, Adapter] = {}
        self.stats = EngineStats()
        self._failures: dict[str, list[int]] = {}
        self._generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._serving = threading.Event()
        self._timer: threading.Timer | None = None
        # Where `vllm serve --host --port` binds (the rehearsal's servers); port 0: a free one.
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class(), bind_and_activate=False)
        self._httpd.daemon_threads = True

    # --- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self) -> FakeVLLMServer:
        # Bound (the port is taken) but not listening: connections are refused, as while vLLM loads.
        self._httpd.server_bind()
        if self.ready_after == 0:
            self._listen()
        elif self.ready_after is not None:
            self._timer = threading.Timer(self.ready_after, self._listen)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _listen(self) -> None:
        self._httpd.server_activate()
        self._serving.set()
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        if self._serving.is_set():
            self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeVLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- test helpers ----------------------------------------------------------------------------

    def bodies(self, path: str) -> list[Any]:
        return [r.body for r in self.requests if r.path == path]

    def fail_next(self, path: str, *statuses: int) -> None:
        """Answer the next requests to `path` with these error statuses (overload, restarts)."""
        self._failures.setdefault(path, []).extend(statuses)

    # --- HTTP ------------------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn; every answer sets Content-Length

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def _answer(self, method: str) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, payload = fake.dispatch(method, self.path, headers, raw)
                if isinstance(payload, dict):
                    data, content_type = json.dumps(payload).encode(), "application/json"
                else:
                    # LoRA success: plain text and no Content-Type at all (docs/VLLM.md §4).
                    data, content_type = (payload or "").encode(), None
                self.send_response(status)
                if content_type:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def dispatch(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, Payload]:
        text = raw.decode("utf-8", errors="replace")
        try:
            body = json.loads(text) if text else None
        except ValueError:
            body = text
        if (method, path) == ("GET", "/metrics"):
            self.requests.append(Recorded(method, path, headers, body))
            return 200, self.stats.page(self.served[0])
        with self._count_lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            with self.stats.request(self._lock) if path in ENGINE_ROUTES else self._lock:
                self.requests.append(Recorded(method, path, headers, body))
                try:
                    return 200, self._route(method, path, headers, body, text)
                except Reject as rejected:
                    return rejected.status, rejected.body
        finally:
            with self._count_lock:
                self._in_flight -= 1

    def _route(self, method: str, path: str, headers: dict[str, str], body: Any, text: str) -> Payload:
        if self._failures.get(path):
            status = self._failures[path].pop(0)
            raise error(status, "fake failure injected by the test", "InternalServerError")
        authorized = headers.get("authorization") == f"Bearer {self.api_key}"
        if self.api_key and path.startswith(AUTH_PREFIXES) and not authorized:
            raise Reject(401, {"error": "Unauthorized"})
        routes: dict[str, tuple[str, Callable[[Any], Payload]]] = {
            "/health": ("GET", lambda _: None),
            "/v1/models": ("GET", lambda _: self._models()),
            "/v1/completions": ("POST", self._completions),
            "/v1/chat/completions": ("POST", self._chat),
        }
        if self.runtime_lora:
            routes["/v1/load_lora_adapter"] = ("POST", self._load_lora)
            routes["/v1/unload_lora_adapter"] = ("POST", self._unload_lora)
        if path not in routes:
            raise Reject(404, {"detail": "Not Found"})
        allowed, handle = routes[path]
        if method != allowed:
            raise Reject(405, {"detail": "Method Not Allowed"})
        if method == "POST":
            if not headers.get("content-type", "").startswith("application/json"):
                raise error(400, "Unsupported Media Type: Only 'application/json' is allowed", "Bad Request")
            if not isinstance(body, dict):
                raise bad_field("", f"Input should be a valid dictionary or JSON object: {text[:80]!r}")
        return handle(body)

    # --- models ----------------------------------------------------------------------------------

    def _models(self) -> JSONBody:
        now = int(time.time())
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": now,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }

        def card(name: str, created: int, root: str, parent: str | None, length: int | None) -> JSONBody:
            return {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": parent,
                "max_model_len": length,
                "permission": [permission],
            }

        base = [card(name, now, "fake-base-model", None, self.max_model_len) for name in self.served]
        loras = [card(name, a.created, a.path, self.served[0], None) for name, a in self.adapters.items()]
        return {"object": "list", "data": base + loras}

    # --- LoRA --------------------------------------------------------------------------------------

    @staticmethod
    def _required_str(body: JSONBody, name: str) -> str:
        if name not in body:
            raise bad_field(name, "Field required")
        if not isinstance(body[name], str):
            raise bad_field(name, "Input should be a valid string")
        return body[name]

    def _load_lora(self, body: JSONBody) -> str:
        name, path = self._required_str(body, "lora_name"), self._required_str(body, "lora_path")
        if not name or not path:
            raise error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name in self.served:
            raise error(
                400, f"The lora adapter '{name}' conflicts with a served base model.", "InvalidUserInput"
            )
        if name in self.adapters and not body.get("load_inplace"):
            raise error(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                "place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        config = Path(path) / "adapter_config.json"
        if not config.is_file():
            shown = "<path>" if path.startswith(HIDDEN_PATH_ROOTS) else path
            raise error(404, f"Loading lora {name} failed: No adapter found for {shown}", "NotFoundError")
        try:
            rank = int(json.loads(config.read_text()).get("r", 8))
        except (ValueError, AttributeError) as err:
            raise error(500, f"Call to add_lora method failed: {err}", "InternalServerError") from err
        if rank > self.max_lora_rank:
            raise error(
                500,
                f"Call to add_lora method failed: LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.",
                "InternalServerError",
            )
        self.adapters[name] = Adapter(path)
        return f"Success: LoRA adapter '{name}' added successfully."

    def _unload_lora(self, body: JSONBody) -> str:
        name = self._required_str(body, "lora_name")
        if not name:
            raise error(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        if name not in self.adapters:
            raise error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.adapters[name]
        return f"Success: LoRA adapter '{name}' removed successfully."
