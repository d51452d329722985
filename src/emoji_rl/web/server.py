"""play-web's HTTP side: a Starlette app serving the page's files and its JSON API over `Rounds`, on
uvicorn, with the limits a server on a network needs; docs/PLAY_WEB.md says what it promises beyond
127.0.0.1 and which setting sets each limit.

The event loop never waits on the game: every call into `Rounds` (SQLite, the scorer, the job table)
runs on a small thread pool, and model turns run as jobs on their own worker (`web/jobs.py`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import resource
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from emoji_rl.emoji.alphabet import ALPHABET, MAX_EMOJI, MIN_EMOJI, emoji_name
from emoji_rl.errors import UserError
from emoji_rl.web.protocol import protocol_class
from emoji_rl.web.rounds import MAX_TEXT_CHARS, Rounds
from emoji_rl.web.store import AnswerRejected

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
MAX_BODY = 16_384  # bytes of a request body: a guess is at most MAX_TEXT_CHARS characters
# Every request is small and quick (model work runs as jobs the page polls), so a client still
# sending after this many seconds is slow or hostile: its headers get this long from the moment the
# connection waits for them (then it is closed), its body this long again (then a 408).
REQUEST_TIMEOUT_S = 10.0
# Open connections, idle or not (uvicorn's limit_concurrency): a request arriving past it is answered
# 503. An idle connection costs the event loop about 6 KB, not a thread (`make bench` measures it), so
# the cap is set by memory and file descriptors: 300 slow clients leave room for every player.
MAX_CONNECTIONS = 2048
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this (uvicorn's timeout_keep_alive)
MAX_HEADER_BYTES = 16_384  # a request's line and headers; more is a 431
BACKLOG = 2048  # connections the kernel queues before accept (20 polling pages overflowed 5)
# Threads running calls into the game (SQLite, the scorer): each waits for SQLite's fsync, or for
# the store's lock behind another's, so a few more than the cores keep the scorer busy meanwhile.
GAME_THREADS = 16
_FILES = {"/": "index.html", "/app.js": "app.js", "/style.css": "style.css"}
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
# Scripts from our own files only: even if a typed text reached the DOM as markup, it could not run.
_CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.close = status, message, close


def _response(status: int, body: bytes, content_type: str, *, close: bool = False) -> Response:
    headers = {
        "Content-Security-Policy": _CSP,
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }
    if close:  # the request's body was not read to its end: the connection cannot serve another
        headers["Connection"] = "close"
    return Response(body, status, headers, media_type=f"{content_type}; charset=utf-8")


def _json(status: int, obj: object, *, close: bool = False) -> Response:
    return _response(status, json.dumps(obj, ensure_ascii=False).encode(), "application/json", close=close)


def _netloc(url: str) -> str | None:
    try:
        return urlsplit(url).netloc.lower()
    except ValueError:  # an unclosed IPv6 bracket
        return None


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body or b"{}")
        # An escaped lone surrogate ("\ud800") decodes, but SQLite and the answer cannot encode it.
        json.dumps(obj, ensure_ascii=False).encode()
    except (ValueError, RecursionError) as err:  # also: an int of 4,300+ digits, deep nesting
        raise _HTTPError(HTTPStatus.BAD_REQUEST, f"the request is not JSON text: {str(err)[:200]}") from err
    if not isinstance(obj, dict):
        raise _HTTPError(HTTPStatus.BAD_REQUEST, "the request must be a JSON object")
    return obj


class _App:
    """The routes over one game; `run` puts a call into the game on the thread pool."""

    def __init__(self, game: Rounds, pool: ThreadPoolExecutor, request_timeout: float) -> None:
        self.game, self.pool, self.request_timeout = game, pool, request_timeout
        self.files = {path: (STATIC / name).read_bytes() for path, name in _FILES.items()}

    async def run(self, call: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, partial(call, *args))

    async def page(self, request: Request) -> Response:
        path = request.url.path
        return _response(HTTPStatus.OK, self.files[path], _TYPES[Path(_FILES[path]).suffix])

    async def config(self, request: Request) -> Response:
        return _json(
            HTTPStatus.OK,
            {
                "max_turns": self.game.max_turns,
                "max_text_chars": MAX_TEXT_CHARS,
                "min_emoji": MIN_EMOJI,
                "max_emoji": MAX_EMOJI,
            },
        )

    async def alphabet(self, request: Request) -> Response:
        return _json(HTTPStatus.OK, [[e, emoji_name(e)] for e in ALPHABET])

    async def job(self, request: Request) -> Response:
        # On the loop: the job table is in memory, its lock held for a lookup, never across I/O. In the
        # pool, the polls of 20 pages queued behind answers waiting on SQLite's fsync.
        return _json(HTTPStatus.OK, self.game.jobs.status(request.query_params.get("id", "")))

    async def leaderboard(self, request: Request) -> Response:
        return _json(HTTPStatus.OK, await self.run(self.game.leaderboard))

    # --- writes ----------------------------------------------------------------------------------

    async def _read_body(self, request: Request) -> bytes:
        """The body, whole: at most MAX_BODY bytes, within the request's time, as long as announced."""
        raw = request.headers.get("content-length", "0")  # the parser refused a second one
        if not (raw.isascii() and raw.isdigit()):
            raise _HTTPError(
                HTTPStatus.BAD_REQUEST, "the request needs one Content-Length, a byte count", close=True
            )
        if len(raw) > len(str(MAX_BODY)) or int(raw) > MAX_BODY:
            raise _HTTPError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request too large: {raw} bytes", close=True
            )
        body = bytearray()
        try:
            async with asyncio.timeout(self.request_timeout):
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > MAX_BODY:  # chunked, so announced no length
                        raise _HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request too large", close=True)
        except ClientDisconnect as err:  # gone: the answer is for nobody, and uvicorn drops it
            raise _HTTPError(HTTPStatus.BAD_REQUEST, "the client went away", close=True) from err
        except TimeoutError as err:
            message = f"the request did not arrive in {self.request_timeout:g} s"
            raise _HTTPError(HTTPStatus.REQUEST_TIMEOUT, message, close=True) from err
        if len(body) < int(raw):
            message = f"the request ended after {len(body)} of its {raw} bytes"
            raise _HTTPError(HTTPStatus.BAD_REQUEST, message, close=True)
        return bytes(body)

    @staticmethod
    def _check_write(request: Request) -> None:
        """Refuse what a page of another site could make a browser send: a write naming another
        origin, or one in a type a plain HTML form can send (a form cannot send JSON)."""
        source = request.headers.get("origin") or request.headers.get("referer")
        host = request.headers.get("host", "").lower()
        if source is not None and (not host or _netloc(source) != host):
            raise _HTTPError(HTTPStatus.FORBIDDEN, f"a write from another site is refused: {source[:200]!r}")
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            raise _HTTPError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "a write must be application/json")

    def write(self, status: int, action: Callable[[Rounds, dict[str, Any]], object]) -> Callable:
        """A POST endpoint: `action(game, body)` on the thread pool, its result answered as `status`."""

        async def endpoint(request: Request) -> Response:
            # The body first, so a refusal is not answered to a half-read request.
            body = await self._read_body(request)
            self._check_write(request)
            return _json(status, await self.run(action, self.game, _json_object(body)))

        return endpoint

    def routes(self) -> list[Route]:
        game_writes = {
            "/api/guess/start": (202, lambda g, b: {"job": g.start_guess(b.get("player"))}),
            "/api/guess/answer": (
                200,
                lambda g, b: g.answer_guess(b.get("round_id"), b.get("turn"), b.get("text")),
            ),
            "/api/guess/next": (202, lambda g, b: {"job": g.next_turn(b.get("round_id"), b.get("turn"))}),
            "/api/send/start": (200, lambda g, b: g.start_send(b.get("player"))),
            "/api/send/answer": (202, lambda g, b: {"job": g.answer_send(b.get("round_id"), b.get("emoji"))}),
        }
        return [
            *(Route(path, self.page, methods=["GET"]) for path in _FILES),
            Route("/api/config", self.config, methods=["GET"]),
            Route("/api/alphabet", self.alphabet, methods=["GET"]),
            Route("/api/job", self.job, methods=["GET"]),
            Route("/api/leaderboard", self.leaderboard, methods=["GET"]),
            *(Route(path, self.write(*how), methods=["POST"]) for path, how in game_writes.items()),
        ]


async def _refused(request: Request, err: Exception) -> Response:
    if isinstance(err, _HTTPError):
        return _json(err.status, {"error": err.message}, close=err.close)
    if isinstance(err, AnswerRejected):
        return _json(HTTPStatus.CONFLICT, {"error": str(err)})
    if isinstance(err, UserError):  # BadInput among them: what a person typed cannot be played
        return _json(HTTPStatus.BAD_REQUEST, {"error": str(err)})
    assert isinstance(err, HTTPException)  # Starlette's: no route, or not its method
    if err.status_code == HTTPStatus.METHOD_NOT_ALLOWED:
        return _json(err.status_code, {"error": f"{request.method} is not served: GET or POST"})
    return _json(err.status_code, {"error": f"no such page: {request.url.path}"})


def make_app(game: Rounds, pool: ThreadPoolExecutor, request_timeout: float = REQUEST_TIMEOUT_S) -> Starlette:
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        cls: _refused for cls in (_HTTPError, UserError, HTTPException)
    }
    return Starlette(routes=_App(game, pool, request_timeout).routes(), exception_handlers=handlers)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family, backlog=BACKLOG)


def _allow_descriptors(needed: int) -> None:
    """Raise this process's open-file limit to `needed` where the hard limit allows: many systems
    start a process at 1,024, fewer than MAX_CONNECTIONS; past the limit, accepts fail instead."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            log.warning(
                "play-web: at most %d open files (ulimit -Hn), fewer than its %d connections: past them, "
                "new connections wait (raise `ulimit -n`)",
                target,
                needed,
            )


class Server:
    """The app on uvicorn, bound at construction (port 0: a free port, in `server_address`).
    `serve_forever` runs it on the calling thread until `shutdown` (from another thread) or, on the
    main thread, SIGINT/SIGTERM, which uvicorn passes on to the process's handlers once it stopped."""

    def __init__(
        self,
        game: Rounds,
        host: str,
        port: int,
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        _allow_descriptors(max_connections + 256)  # and the process's own files: models, SQLite
        self._pool = ThreadPoolExecutor(GAME_THREADS, thread_name_prefix="play-web")
        self._socket = _bind(host, port)
        self.server_address: tuple[str, int] = self._socket.getsockname()[:2]
        config = uvicorn.Config(
            make_app(game, self._pool, request_timeout),
            # httptools, with the headers' deadline and size (web/protocol.py): uvicorn's h11
            # connection, pure Python, took 250 us of CPU per `GET /`, this one 120-150 us.
            http=protocol_class(request_timeout, MAX_HEADER_BYTES),
            loop="uvloop",
            ws="none",
            limit_concurrency=max_connections,
            timeout_keep_alive=KEEP_ALIVE_S,
            backlog=BACKLOG,
            timeout_graceful_shutdown=request_timeout,  # type: ignore[arg-type]  # a float waits as well
            lifespan="off",
            proxy_headers=False,  # nothing here reads the client's address; Host is checked as sent
            server_header=False,
            headers=[("server", "emoji-rl")],
            log_config=None,  # the CLI's logging; uvicorn's own warnings still reach it
            access_log=False,
        )
        self._uvicorn = uvicorn.Server(config)

    @property
    def started(self) -> bool:
        return self._uvicorn.started

    def serve_forever(self) -> None:
        self._uvicorn.run(sockets=[self._socket])

    def shutdown(self) -> None:
        """Stop serving: uvicorn's loop sees it within 0.1 s, then closes the connections."""
        self._uvicorn.should_exit = True

    def server_close(self) -> None:
        self._socket.close()
        self._pool.shutdown(wait=True, cancel_futures=True)


def make_server(game: Rounds, host: str, port: int, **limits: Any) -> Server:
    """The server, bound and ready for `serve_forever`; `limits`: `Server`'s."""
    return Server(game, host, port, **limits)
