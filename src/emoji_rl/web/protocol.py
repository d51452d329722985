"""What play-web adds to uvicorn's HTTP/1.1 connection (its httptools one), for what uvicorn has no
setting:

- a deadline on each request's headers, counted from when the connection starts waiting for them
  (its accept, or the end of the previous answer): uvicorn's `timeout_keep_alive` is reset by every
  byte, so a client trickling a header line every few seconds would hold its connection forever;
- a cap on the bytes of a request's line and headers (uvicorn sets one for h11 only);
- a malformed request answered in JSON naming what the parser found wrong (uvicorn answers a fixed
  text), and a request without an HTTP version (0.9) refused;
- a client that ends its input before the body its Content-Length announced: the app is told the
  body ended, so it can answer 400 saying so (uvicorn would drop the connection unanswered).

The body's own deadline is the app's (`web/server.py`): it answers 408 when the body stops coming.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


class Refused(httptools.HttpParserError):
    """A request refused while its headers are read: what uvicorn answers 400 (here, `status`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Parser:
    """httptools' parser, keeping the last error it raised: uvicorn catches it and keeps only a fixed
    message. (An error raised in one of our callbacks comes back wrapped, the original as context.)"""

    def __init__(self, parser: httptools.HttpRequestParser) -> None:
        self._parser = parser
        self.last_error: Exception | None = None

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self.last_error = err.__context__ if isinstance(err.__context__, Refused) else err
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools connection with a deadline of `header_timeout` seconds on each request's
    headers and at most `max_header_bytes` of them (set on the subclass `protocol_class` makes)."""

    header_timeout: float
    max_header_bytes: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser = _Parser(self.parser)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wait_for_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_deadline()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.pipeline:  # else the next request, read already, has started
            self._wait_for_headers()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and the line's end
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.max_header_bytes:
            raise Refused(431, f"the request's line and headers are over {self.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        self._stop_header_deadline()
        if self.parser.get_http_version() not in ("1.0", "1.1"):
            raise Refused(400, "the request line names no HTTP version (HTTP/1.0 or 1.1)")
        super().on_headers_complete()

    def _wait_for_headers(self) -> None:
        if self._header_deadline is None and not self.transport.is_closing():
            self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _stop_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        """Close without an answer: the client has not said what it asks, so nothing could be read."""
        self._header_deadline = None
        if not self.transport.is_closing():
            log.debug("play-web: %s sent no whole request in %g s: closed", self.client, self.header_timeout)
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        err = self.parser.last_error
        status = err.status if isinstance(err, Refused) else 400
        message = str(err) if isinstance(err, Refused) else f"not an HTTP request: {err or msg}"
        body = json.dumps({"error": message[:300]}).encode()
        head = (
            f"HTTP/1.1 {status} {'Bad Request' if status == 400 else 'Request Header Fields Too Large'}\r\n"
            "content-type: application/json; charset=utf-8\r\nx-content-type-options: nosniff\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()

    def eof_received(self) -> bool | None:
        """A client done sending while its body is still due: the app reads the body's end there (and
        answers that it is short); the connection stays open for that answer, then closes."""
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()
            return True
        return None


def protocol_class(header_timeout: float, max_header_bytes: int) -> type[DeadlineProtocol]:
    """The protocol uvicorn builds for each connection (its `http` setting), with these limits."""
    attributes = {"header_timeout": header_timeout, "max_header_bytes": max_header_bytes}
    return type("PlayWebProtocol", (DeadlineProtocol,), attributes)
