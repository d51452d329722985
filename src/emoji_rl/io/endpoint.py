"""Talking to OpenAI-compatible servers (the vLLM judge and policy servers): base URL, API key,
timeouts, retries with backoff, readiness and error messages, in one place (docs/VLLM.md §5, §6).

Connection errors, timeouts, 429 and 5xx are retried with exponential backoff; after the last
attempt the error names the URL. Any other error status is final: retrying a bad request cannot
fix it, so it is raised at once as a `ServerError` carrying the status and vLLM's `param`; so are
the 5xx answers vLLM gives a request it will always refuse (`FINAL_ERRORS`).

Callers open an httpx client per call rather than per object: a trainer's step is played in a fresh
`asyncio.run` loop, or on its rollout thread's loop, and an `httpx.AsyncClient` is bound to the loop
that opened it.

    python -m emoji_rl.io.endpoint http://127.0.0.1:8002 --server_wait_s 900   # wait for a server (launch/)
    python -m emoji_rl.io.endpoint http://127.0.0.1:8002 --once   # does one answer there now? (exit 0/1)
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import httpx

from emoji_rl.config import Checked
from emoji_rl.errors import UserError

log = logging.getLogger("emoji_rl.endpoint")

# 429: rate limits of hosted OpenAI-compatible servers; 5xx: a server restarting or overloaded.
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
LORA_RANK_ERROR = re.compile(r"LoRA rank (\d+) is greater than max_lora_rank (\d+)")
"""vLLM 0.33's refusal of an adapter above --max-lora-rank (lora/peft_helper.py `validate_legal`), which
its engine wraps as "Call to add_lora method failed: ..." and the server answers with a 500."""
FINAL_ERRORS = (LORA_RANK_ERROR,)
"""5xx answers that the same request would get again: raised at once, not retried (~31 s) before the
hint that says what to change."""

WAIT_FIELD = "server_wait_s"
"""The config field (and this module's CLI option) that sets how long a stage waits for its servers."""
SERVER_WAIT_S = 900.0
"""Its default: a large model takes minutes to load, and vLLM refuses connections until it has."""
PROGRESS_S = 30.0
"""How often a wait says it is still waiting."""
UNHELD_S = 120.0
"""How long a stage waits for a server on this machine whose port no process holds: vLLM binds its
port within seconds of its start, long before its model loads (and listens once it has), so a port
nobody holds for this long is a server nobody started."""
START_HINT = (
    "start it (make serve-judge / make serve-policy; launch/serve_judge.sh or launch/serve_policy.sh "
    "--dry-run prints its vllm serve command, host and port)"
)


@dataclass
class ServerWaitConfig(Checked):
    """How long a stage that talks to vLLM servers (a judge's, the policy's) waits for them to start."""

    server_wait_s: float = field(
        default=SERVER_WAIT_S,
        metadata={
            "help": "seconds to wait at start for a vLLM server to answer /health (it refuses connections "
            f"while its model loads), saying so every {PROGRESS_S:g} s: the openai judge's, and in grpo "
            "with --engine vllm the policy server's"
        },
    )


@dataclass(frozen=True)
class Endpoint:
    """One server. `url` is the base (`http://127.0.0.1:8002`); a trailing `/v1` is dropped, since
    `/health` lives at the root and every API path here is written out in full."""

    url: str
    api_key_env: str | None = None
    """Name of the environment variable holding the key (the one the launch script started the server
    with); unset or empty sends no key. The key itself is never stored or logged."""
    timeout_s: float = 300.0
    attempts: int = 6
    """Tries per request, first included; 6 with backoff 1 s waits about 31 s before giving up."""
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise UserError(f"server url {self.url!r} must start with http:// or https://")
        object.__setattr__(self, "url", self.url.rstrip("/").removesuffix("/v1"))
        if self.attempts < 1:
            raise UserError(f"attempts={self.attempts} must be >= 1 (tries per request, the first included)")

    def headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def delays(self) -> Iterator[float]:
        """Seconds to wait before each retry: backoff doubling up to `max_backoff_s`."""
        for retry in range(self.attempts - 1):
            yield min(self.backoff_s * 2**retry, self.max_backoff_s)


class ServerError(UserError):
    """The server answered with an error status that retrying will not fix."""

    def __init__(self, url: str, status: int, message: str, param: str | None, hint: str = "") -> None:
        self.url, self.status, self.message, self.param = url, status, message, param
        where = f" (param {param})" if param else ""
        super().__init__(f"{url} answered {status}: {message}{where}" + (f"; {hint}" if hint else ""))

    @property
    def missing_route(self) -> bool:
        """A 404 from the router itself (FastAPI's `{"detail":"Not Found"}`), not from a handler."""
        return self.status == 404 and self.message == "Not Found"


def error_detail(response: httpx.Response) -> tuple[str, str | None]:
    """Message and param of an error body: vLLM's envelope, the auth middleware's
    `{"error":"Unauthorized"}`, FastAPI's `{"detail": ...}`, or else the raw text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase, None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            param = error.get("param")
            return str(error.get("message", "")), str(param) if param is not None else None
        if isinstance(error, str):
            return error, None
        if "detail" in body:
            return str(body["detail"]), None
    return response.text.strip(), None


def _server_error(response: httpx.Response, endpoint: Endpoint, url: str) -> ServerError:
    message, param = error_detail(response)
    hint = ""
    if response.status_code == 401:
        hint = (
            f"the API key was missing or refused: set {endpoint.api_key_env} to the key the server was started with"
            if endpoint.api_key_env
            else "the server wants an API key: configure the environment variable that holds it"
        )
    return ServerError(url, response.status_code, message, param, hint)


def _retryable(outcome: httpx.Response | httpx.TransportError) -> str | None:
    """Why a try failed in a way worth retrying, or None when its outcome is final."""
    if isinstance(outcome, httpx.TransportError):
        # ConnectError (refused: the server is down or still loading), timeouts, dropped connections.
        return f"{type(outcome).__name__}: {outcome}" if str(outcome) else type(outcome).__name__
    if outcome.status_code in RETRYABLE_STATUS:
        message = error_detail(outcome)[0]
        if any(final.search(message) for final in FINAL_ERRORS):
            return None
        return f"HTTP {outcome.status_code}: {message}"
    return None


def _gave_up(endpoint: Endpoint, url: str, outcome: httpx.Response | httpx.TransportError) -> UserError:
    if isinstance(outcome, httpx.Response):
        # It answered every time, with an error: report the last one, status and message included.
        return _server_error(outcome, endpoint, url)
    return UserError(
        f"{url} did not answer after {endpoint.attempts} tries ({_retryable(outcome)}): "
        "is the server running? Start it with launch/serve_policy.sh or launch/serve_judge.sh "
        "(make serve-policy / serve-judge) and read its log"
    )


class _Tries:
    """One request's tries, whichever client sends them (`request`, `request_sync`): after each try,
    the response once it is final, or the seconds to wait before the next; the error when it is an
    error status or the last try failed."""

    def __init__(self, endpoint: Endpoint, method: str, path: str) -> None:
        self.endpoint, self.method, self.url = endpoint, method, endpoint.url + path
        self.headers = endpoint.headers()
        self._delays = endpoint.delays()

    def after(self, outcome: httpx.Response | httpx.TransportError) -> httpx.Response | float:
        failure = _retryable(outcome)
        if failure is None:
            assert isinstance(outcome, httpx.Response), outcome
            if outcome.status_code >= 400:
                raise _server_error(outcome, self.endpoint, self.url)
            return outcome
        delay = next(self._delays, None)
        if delay is None:
            raise _gave_up(self.endpoint, self.url, outcome)
        log.warning("%s %s failed (%s); retrying in %.1f s", self.method, self.url, failure, delay)
        return delay


async def request(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    method: str,
    path: str,
    body: Mapping[str, object] | None = None,
) -> httpx.Response:
    """One API call with retries; returns a response with a status below 400."""
    tries = _Tries(endpoint, method, path)
    while True:
        try:
            outcome = await client.request(method, tries.url, json=body, headers=tries.headers)
        except httpx.TransportError as err:
            outcome = err
        wait = tries.after(outcome)
        if isinstance(wait, httpx.Response):
            return wait
        await asyncio.sleep(wait)


def request_sync(
    client: httpx.Client, endpoint: Endpoint, method: str, path: str, body: Mapping[str, object] | None = None
) -> httpx.Response:
    """`request` for callers outside an event loop (adapter loading between training steps)."""
    tries = _Tries(endpoint, method, path)
    while True:
        try:
            outcome = client.request(method, tries.url, json=body, headers=tries.headers)
        except httpx.TransportError as err:
            outcome = err
        wait = tries.after(outcome)
        if isinstance(wait, httpx.Response):
            return wait
        time.sleep(wait)


def port_held(url: str) -> bool | None:
    """Whether a process of this machine holds the port of `url` (bound to it, listening or not), or
    None where this cannot be told: a host that is not this machine's loopback. Told by binding it:
    refused, someone holds it (vLLM binds its port when it starts, and listens once its model has
    loaded, so until then it refuses connections as a port nobody holds does)."""
    parts = httpx.URL(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = socket.getaddrinfo(parts.host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    if not addresses or not all(ipaddress.ip_address(a[4][0]).is_loopback for a in addresses):
        return None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(address)
            except OSError as err:
                return True if err.errno == errno.EADDRINUSE else None
    return False


def wait_for_server(
    url: str,
    what: str = "the server",
    timeout_s: float = SERVER_WAIT_S,
    hint: str = START_HINT,
    *,
    poll_s: float = 2.0,
    progress_s: float = PROGRESS_S,
    unheld_s: float | None = UNHELD_S,
) -> None:
    """Block until `what` (the judge server, the policy server) at `url` answers `/health`, saying at
    once what it waits for and where, then every `progress_s` how long it has waited: a server that
    is not there must not look like a hang. After `timeout_s` the error names the URL and `hint`.

    vLLM refuses connections until its model is loaded (there is no "loading" status), then answers
    200; a 503 means its engine died, which waiting will not fix. Any other answer also means the
    server is listening: a generic OpenAI-compatible server may lack /health. On this machine, a port
    that no process has held for `unheld_s` (None: wait the whole `timeout_s`, as a launcher that has
    just started the server does) is a server nobody started: the wait ends then (`port_held`).
    """
    health = Endpoint(url).url + "/health"
    start = time.monotonic()
    deadline, next_progress = start + timeout_s, start + progress_s
    last = "no answer yet"
    held_at = start  # when a process last held the port, as far as this wait knows
    log.info("waiting for %s at %s (up to %g s: --%s)", what, health, timeout_s, WAIT_FIELD)
    with httpx.Client() as client:
        while True:
            try:
                # One poll never outlasts the wait (a host that drops packets holds a connect until timeout).
                remaining = deadline - time.monotonic()
                response = client.get(health, timeout=min(max(poll_s, 5.0), max(remaining, 0.1)))
            except httpx.TransportError as err:
                last = type(err).__name__
                if port_held(health) is not False:
                    held_at = time.monotonic()
                elif unheld_s is not None and time.monotonic() - held_at >= unheld_s:
                    raise UserError(
                        f"{what} does not answer at {health} ({last}) and no process of this machine has held "
                        f"its port for {time.monotonic() - start:.0f} s (a vLLM server holds it from its "
                        f"start): {hint}"
                    ) from None
            else:
                if response.status_code == 503:
                    raise UserError(
                        f"{what} at {health} answered 503: the server is up but its engine is dead; "
                        "read the server's log and restart it"
                    )
                if response.status_code != 200:
                    log.warning("%s answered %d; taking %s as up", health, response.status_code, what)
                log.info("%s at %s is up after %.0f s", what, health, time.monotonic() - start)
                return
            now = time.monotonic()
            if now >= deadline:
                raise UserError(
                    f"{what} did not answer at {health} within {timeout_s:g} s ({last}): {hint}; check that "
                    f"host and port are the server's, and read its log: a large model takes minutes to load, "
                    f"so raise --{WAIT_FIELD} if the log shows progress"
                )
            if now >= next_progress:
                log.info(
                    "still waiting for %s at %s: %.1f s of %g s (%s)",
                    what,
                    health,
                    now - start,
                    timeout_s,
                    last,
                )
                while next_progress <= now:
                    next_progress += progress_s
            time.sleep(max(min(poll_s, deadline - now, next_progress - now), 0.0))


def answers_now(url: str, timeout_s: float = 5.0) -> bool:
    """Whether a server answers `url`'s /health now: one request, no waiting for one that is starting
    (the launchers ask before they start a server of their own on that address)."""
    try:
        with httpx.Client() as client:
            client.get(Endpoint(url).url + "/health", timeout=timeout_s)
    except httpx.TransportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Wait until an OpenAI-compatible server answers /health.")
    parser.add_argument("url", help="base URL, e.g. http://127.0.0.1:8002")
    parser.add_argument(
        "--once",
        action="store_true",
        help="ask once, without waiting: exit 0 if a server answers now, else 1",
    )
    parser.add_argument(
        f"--{WAIT_FIELD}",
        "--timeout",
        dest="wait_s",
        type=float,
        default=SERVER_WAIT_S,
        help=f"seconds to wait (default: {SERVER_WAIT_S:g}); progress is said every {PROGRESS_S:g} s",
    )
    args = parser.parse_args(argv)
    if args.once:
        up = answers_now(args.url)
        print(f"{Endpoint(args.url).url} {'answers' if up else 'does not answer'}")
        return 0 if up else 1
    logging.basicConfig(level=logging.INFO, format="wait: %(message)s")
    try:
        # Launchers wait here right after starting the server, whose port it holds only once vLLM has
        # imported: the whole wait, whoever holds the port.
        wait_for_server(args.url, timeout_s=args.wait_s, unheld_s=None)
    except UserError as err:
        print(f"wait: error: {err}", file=sys.stderr)
        return 1
    print(f"{Endpoint(args.url).url} is up")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
