"""play-web's HTTP side, on the standard library's threaded server: the page's files and its JSON
API over `Rounds`, with the limits a server on a network needs (body size, a deadline over each
request's reads, at most MAX_CONNECTIONS at once, same-origin POSTs only); docs/PLAY_WEB.md says what
it promises beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import logging
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from emoji_rl.emoji.alphabet import ALPHABET, MAX_EMOJI, MIN_EMOJI, emoji_name
from emoji_rl.errors import UserError
from emoji_rl.web.jobs import BadInput
from emoji_rl.web.rounds import MAX_TEXT_CHARS, Rounds
from emoji_rl.web.store import AnswerRejected

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
MAX_BODY = 16_384  # bytes of a request body: a guess is at most MAX_TEXT_CHARS characters
# Every request is small and quick (model work runs as jobs the page polls), so a client still
# sending after this many seconds is slow or hostile: its connection ends, freeing its thread.
REQUEST_TIMEOUT_S = 10.0
# Connections served at once, one thread each; more are answered 503 at once, so a crowd of slow
# clients cannot make a thread each. 20 players with two tabs and their polls needed about 40.
MAX_CONNECTIONS = 64
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


class _DeadlineReader(io.RawIOBase):
    """A connection's input that ends at a deadline: a socket timeout alone bounds each read, and a
    client trickling a byte at a time would reset it forever."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock, self._deadline = sock, time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class Handler(BaseHTTPRequestHandler):
    game: Rounds  # set on the subclass make_server builds
    request_timeout: float = REQUEST_TIMEOUT_S
    server_version = "emoji-rl"

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the same socket, read by the request's deadline instead
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self.request_timeout))

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What http.server answers a request it cannot parse: JSON, as every other error."""
        if code == HTTPStatus.NOT_IMPLEMENTED:  # http.server's answer to a method it has no do_ for
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not served: GET or POST"
        self.log_error("code %d, message %s", code, message)
        # A line too garbled to name its version would be answered as HTTP/0.9: a bare body, which
        # no client reads as an error.
        if self.request_version == "HTTP/0.9":
            self.request_version = self.protocol_version
        self._json(code, {"error": message or HTTPStatus(code).phrase})

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.connection.settimeout(self.request_timeout)  # the read's deadline may be spent: a 408
        self.send_response(status)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", _CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: object) -> None:
        self._send(status, json.dumps(obj, ensure_ascii=False).encode(), "application/json")

    def _content_length(self) -> int:
        values = set(self.headers.get_all("Content-Length") or ["0"])
        raw = values.pop().strip() if len(values) == 1 else ""
        if not (raw.isascii() and raw.isdigit()):
            raise BadInput("the request needs one Content-Length, a byte count")
        if len(raw) > len(str(MAX_BODY)) or int(raw) > MAX_BODY:
            raise _HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request too large: {raw} bytes")
        return int(raw)

    def _read_body(self) -> bytes:
        length = self._content_length()
        try:
            body = self.rfile.read(length)
        except TimeoutError as err:
            raise _HTTPError(
                HTTPStatus.REQUEST_TIMEOUT, f"the request did not arrive in {self.request_timeout:g} s"
            ) from err
        if len(body) < length:
            raise BadInput(f"the request ended after {len(body)} of its {length} bytes")
        return body

    def _check_write(self) -> None:
        """Refuse what a page of another site could make a browser send: a write naming another
        origin, or one in a type a plain HTML form can send (a form cannot send JSON)."""
        source = self.headers.get("Origin") or self.headers.get("Referer")
        host = (self.headers.get("Host") or "").lower()
        if source is not None and (not host or _netloc(source) != host):
            raise _HTTPError(HTTPStatus.FORBIDDEN, f"a write from another site is refused: {source[:200]!r}")
        if self.headers.get_content_type() != "application/json":
            raise _HTTPError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "a write must be application/json")

    def _body(self) -> dict[str, Any]:
        body = self._read_body()  # first, so a refusal is not answered to a half-read request
        self._check_write()
        return _json_object(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path in _FILES:
            path = STATIC / _FILES[url.path]
            return self._send(HTTPStatus.OK, path.read_bytes(), _TYPES[path.suffix])
        self._api(lambda: self._get(url.path, parse_qs(url.query)))

    def do_POST(self) -> None:
        self._api(lambda: self._post(urlsplit(self.path).path, self._body()))

    def _api(self, handle) -> None:
        try:
            status, obj = handle()
        except _HTTPError as err:
            status, obj = err.status, {"error": err.message}
        except BadInput as err:
            status, obj = HTTPStatus.BAD_REQUEST, {"error": str(err)}
        except AnswerRejected as err:
            status, obj = HTTPStatus.CONFLICT, {"error": str(err)}
        except UserError as err:
            status, obj = HTTPStatus.BAD_REQUEST, {"error": str(err)}
        self._json(status, obj)

    def _get(self, path: str, query: dict[str, list[str]]) -> tuple[int, object]:
        game = self.game
        if path == "/api/config":
            return HTTPStatus.OK, {
                "max_turns": game.max_turns,
                "max_text_chars": MAX_TEXT_CHARS,
                "min_emoji": MIN_EMOJI,
                "max_emoji": MAX_EMOJI,
            }
        if path == "/api/alphabet":
            return HTTPStatus.OK, [[e, emoji_name(e)] for e in ALPHABET]
        if path == "/api/job":
            return HTTPStatus.OK, game.jobs.status(query.get("id", [""])[0])
        if path == "/api/leaderboard":
            return HTTPStatus.OK, game.leaderboard()
        raise _HTTPError(HTTPStatus.NOT_FOUND, f"no such page: {path}")

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, object]:
        game = self.game
        if path == "/api/guess/start":
            return HTTPStatus.ACCEPTED, {"job": game.start_guess(body.get("player"))}
        if path == "/api/guess/answer":
            return HTTPStatus.OK, game.answer_guess(body.get("round_id"), body.get("turn"), body.get("text"))
        if path == "/api/guess/next":
            return HTTPStatus.ACCEPTED, {"job": game.next_turn(body.get("round_id"), body.get("turn"))}
        if path == "/api/send/start":
            return HTTPStatus.OK, game.start_send(body.get("player"))
        if path == "/api/send/answer":
            return HTTPStatus.ACCEPTED, {"job": game.answer_send(body.get("round_id"), body.get("emoji"))}
        raise _HTTPError(HTTPStatus.NOT_FOUND, f"no such action: {path}")


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
        raise BadInput(f"the request is not JSON text: {str(err)[:200]}") from err
    if not isinstance(obj, dict):
        raise BadInput("the request must be a JSON object")
    return obj


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a request in flight does not hold up a stop
    # socketserver listens with a backlog of 5. Every request is a new connection (HTTP/1.0) and
    # each page polls its jobs, so 20 players at once overflowed it: the kernel then dropped
    # connections, or reset them (ListenOverflows, SyncookiesFailed; the load test saw resets).
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[Handler], max_connections: int) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            return self._refuse(request)
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started, so none will give the slot back
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        """503 on the listening thread, never waiting: a client that does not read loses it."""
        body = json.dumps({"error": "the server is busy: try again in a moment"}).encode()
        head = (
            "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
        )
        request.setblocking(False)
        with contextlib.suppress(OSError):
            request.send(head.encode() + body)
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # the client left before its answer
            log.debug("play-web: %s went away: %s", client_address, sys.exc_info()[1])
            return
        super().handle_error(request, client_address)


def make_server(
    game: Rounds,
    host: str,
    port: int,
    *,
    max_connections: int = MAX_CONNECTIONS,
    request_timeout: float = REQUEST_TIMEOUT_S,
) -> Server:
    """The server, bound and ready for `serve_forever` (port 0: a free port, in `server_address`)."""
    handler = type("GameHandler", (Handler,), {"game": game, "request_timeout": request_timeout})
    return Server((host, port), handler, max_connections)
