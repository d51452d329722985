"""play-web under hostile HTTP, over real sockets to a real server on 127.0.0.1: malformed and slow
requests, a crowd of idle connections, writes from another site, and what send mode may show.
Each answer is asserted, never how fast it came: a client waits up to WAIT_S for it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections import Counter

import httpx
import pytest

from emoji_rl.errors import UserError
from emoji_rl.web.rounds import Rounds, for_send
from emoji_rl.web.store import Store

from .conftest import TARGETS, Client, StandInModels, serving

WAIT_S = 30  # how long a client waits for an answer: only a server that never answers reaches it


@pytest.fixture
def serve(tmp_path, senders):
    """A factory: (client, game, (host, port)) of a server with make_server's `options`."""

    @contextlib.contextmanager
    def start(**options):
        game = Rounds(
            Store(tmp_path / "answers.db"), StandInModels(), senders, TARGETS, max_turns=2, tau=0.85
        )
        with serving(game, **options) as base:
            host, port = base.removeprefix("http://").rsplit(":", 1)
            yield Client(base), game, (host, int(port))

    return start


def exchange(address, request: bytes, *, end_input: bool = False) -> bytes:
    """Send `request` on a new connection and read until the server closes it."""
    with socket.create_connection(address, timeout=WAIT_S) as sock:
        sock.sendall(request)
        if end_input:
            sock.shutdown(socket.SHUT_WR)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_response(sock: socket.socket) -> bytes:
    """One whole response on a kept-alive connection: its head, then as many body bytes as it says
    (one recv may end between the two on a loaded machine)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def answer(response: bytes) -> tuple[int, dict]:
    """(status, JSON body) of a raw response, which must be JSON."""
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *headers = head.decode().split("\r\n")
    assert "content-type: application/json; charset=utf-8" in [h.lower() for h in headers], head
    return int(status_line.split()[1]), json.loads(body)


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_malformed_requests_are_4xx_json_and_log_no_traceback(serve, capfd):
    with serve() as (_, game, address):
        for lengths in (["abc"], ["-1"], ["+5"], ["1_0"], [""], ["2", "3"]):
            request = post("/api/guess/start", b"{}", *(f"Content-Length: {n}" for n in lengths))
            status, body = answer(exchange(address, request))
            assert status == 400 and "Content-Length" in body["error"], (lengths, body)
        huge = post("/api/guess/start", b"", "Content-Length: 9999999999999999999")
        assert answer(exchange(address, huge))[0] == 413
        # Past 2^64 the parser does not read it as a byte count at all.
        huger = post("/api/guess/start", b"", "Content-Length: 99999999999999999999999")
        status, body = answer(exchange(address, huger))
        assert status == 400 and "Content-Length" in body["error"]
        for line in (b"NOT HTTP AT ALL", b"POST /api/guess/start HTTP/x.y", b"POST /api/guess/start"):
            status, body = answer(exchange(address, line + b"\r\n\r\n"))
            assert status == 400 and body["error"], line
        for method in ("PUT", "DELETE"):
            request = f"{method} /api/guess/start HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            status, body = answer(exchange(address, request.encode()))
            assert status == 405 and "GET or POST" in body["error"], method
        # A method HTTP does not define is refused by the parser, before any route.
        status, body = answer(exchange(address, b"FOO /api/guess/start HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
        assert status == 400 and "method" in body["error"]
        # Headers past 16 KiB: refused as they arrive, not buffered to their end.
        padded = post(
            "/api/guess/start", b"{}", "Content-Length: 2", *[f"X-Pad-{i}: {'x' * 100}" for i in range(200)]
        )
        status, body = answer(exchange(address, padded))
        assert status == 431 and "16384 bytes" in body["error"]
        assert game.store.rounds_per_sender("guess") == {}
    assert "Traceback" not in capfd.readouterr().err


def test_a_short_or_slow_request_is_ended_at_the_deadline(serve):
    with serve(request_timeout=0.5) as (_, game, address):
        # The body never comes: 408, once the request's time is up.
        status, body = answer(exchange(address, post("/api/send/start", b'{"pla', "Content-Length: 100")))
        assert status == 408 and "did not arrive" in body["error"]
        # The client stops sending before the body's end: 400 saying so, not a wait.
        ended = exchange(address, post("/api/send/start", b"{}", "Content-Length: 100"), end_input=True)
        status, body = answer(ended)
        assert status == 400 and "ended after 2 of its 100 bytes" in body["error"]
        # Headers that never end: the connection closes, with nothing to answer.
        assert exchange(address, b"POST /api/send/start HTTP/1.1\r\nHost: 127.0.0.1\r\n") == b""
        # The same on a kept-alive connection after an answer, however the next headers trickle (a
        # line every 0.1 s would restart uvicorn's keep-alive timer each time).
        with socket.create_connection(address, timeout=WAIT_S) as sock:
            sock.sendall(b"GET /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            sock.sendall(b"GET /api/config HTTP/1.1\r\n")
            start = time.monotonic()
            with contextlib.suppress(OSError):  # the server closing while a line is on its way
                while time.monotonic() - start < WAIT_S:
                    sock.sendall(b"X-Slow: 1\r\n")
                    time.sleep(0.1)
            assert time.monotonic() - start < 5
            with contextlib.suppress(ConnectionResetError):  # the lines that came after the close
                assert read_all(sock) == b""
        assert game.store.rounds_per_target("send") == {}


def test_out_of_range_numbers_and_wrong_types_are_400s_naming_the_field(serve, capfd):
    with serve() as (client, game, _):
        played = client.guess_round()["round_id"]  # a round the store knows: the numbers reach SQLite
        for path, body, field in [
            ("/api/guess/answer", {"round_id": played, "turn": 10**30, "text": "pizza"}, "turn"),
            ("/api/guess/answer", {"round_id": played, "turn": 2**63, "text": "pizza"}, "turn"),
            ("/api/guess/next", {"round_id": played, "turn": 10**30}, "turn"),
            ("/api/guess/next", {"round_id": played, "turn": 1.0}, "turn"),
            ("/api/guess/next", {"round_id": 7, "turn": 1}, "round id"),
            ("/api/guess/answer", {"round_id": played, "turn": 1, "text": ["pizza"]}, "guess"),
            ("/api/guess/start", {"player": {"name": "ann"}}, "name"),
            ("/api/send/answer", {"round_id": played, "emoji": 7}, "emoji"),
        ]:
            r = client.post(path, body)
            assert r.status_code == 400 and field in r.json()["error"], (path, body, r.text)
        json_type = {"Content-Type": "application/json"}
        for raw in (
            b'{"turn": ' + b"9" * 5000 + b"}",  # past Python's 4,300 digits of int parsing
            b'{"player": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # past the recursion limit
            b'{"player": "\\ud800"}',  # a lone surrogate, which SQLite cannot store
        ):
            r = client.http.post("/api/guess/start", content=raw, headers=json_type)
            assert r.status_code == 400 and "not JSON text" in r.json()["error"], r.text
        assert game.store.answers() == [] and sum(game.store.rounds_per_sender("guess").values()) == 1
    assert "Traceback" not in capfd.readouterr().err


def test_idle_connections_take_no_thread_and_a_request_past_the_cap_gets_503(serve):
    with serve(max_connections=100) as (client, _, address):
        assert client.get("/api/config").status_code == 200
        threads = threading.active_count()
        slow = [socket.create_connection(address, timeout=WAIT_S) for _ in range(100)]
        for sock in slow:
            sock.sendall(b"POST /api/guess/start HTTP/1.1\r\n")  # headers that never end
        busy = [exchange(address, b"GET /api/config HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") for _ in range(5)]
        assert all(r.startswith(b"HTTP/1.1 503 ") for r in busy), busy
        assert threading.active_count() == threads  # a hundred connections held, no thread more
        for sock in slow:
            sock.close()
        for _ in range(WAIT_S * 100):  # the server sees them go
            if client.get("/api/config").status_code == 200:
                break
            time.sleep(0.01)
        assert client.get("/api/config").status_code == 200


def test_writes_from_another_site_or_not_json_are_refused(serve):
    with serve() as (client, game, _):
        own = str(client.http.base_url).rstrip("/")
        for headers, status in [
            ({"Origin": "http://evil.example"}, 403),
            ({"Origin": "null"}, 403),  # a sandboxed frame, a file
            ({"Origin": "http://[::1"}, 403),
            ({"Referer": "http://evil.example/play.html"}, 403),
            ({"Origin": own, "Content-Type": "text/plain"}, 415),  # what a form or a no-CORS fetch sends
            ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        ]:
            r = client.http.post("/api/send/start", content=b'{"player": "eve"}', headers=headers)
            assert r.status_code == status and r.json()["error"], (headers, r.text)
        assert game.store.rounds_per_target("send") == {}
        # The page's own requests (app.js: same origin, JSON) and those of no browser still write.
        for headers in ({"Origin": own}, {"Referer": own + "/"}, {}):
            assert client.post("/api/send/start", {"player": "ann"}, headers=headers).status_code == 200
        assert sum(game.store.rounds_per_target("send").values()) == 3


def test_send_mode_never_shows_a_target_guess_mode_plays(serve):
    with serve() as (client, game, _):
        shown = {client.post("/api/send/start", {}).json()["target"] for _ in range(len(TARGETS) * 4)}
        assert not shown & set(game.targets.values())
        assert shown == set(game.send_targets.values())
        assert set(game.targets) | set(game.send_targets) == set(dict(TARGETS))
    # By the message, not its id nor its place: two copies of one message go to the same mode.
    assert for_send("the movie starts at nine") and for_send("The movie starts at NINE!")
    assert not for_send("I missed the bus") and not for_send("i missed the bus.")


def test_a_game_needs_targets_for_both_modes(tmp_path, senders):
    guess_only = [t for t in TARGETS if not for_send(t[1])]
    with pytest.raises(UserError, match="targets for both modes"):
        Rounds(Store(tmp_path / "a.db"), StandInModels(), senders, guess_only, max_turns=2, tau=0.85)


SLOW_CLIENTS = 300
ATTACK_S = 60.0
HEADER_GAP_S = 2.0  # a slow client's pause between header lines
RECONNECT_S = 0.2  # its pause before it reconnects, once the server closed its connection


async def _slowloris(address, until: float, counts: Counter) -> None:
    """SLOW_CLIENTS connections sending a request's headers a line at a time and never ending them,
    each reconnecting when the server closes it, until `until` (a bounded loop, on 127.0.0.1)."""

    async def one(k: int) -> None:
        await asyncio.sleep(k * 0.005)  # 300 connects spread over 1.5 s, as a script opens them
        while time.monotonic() < until:
            writer = None
            try:
                reader, writer = await asyncio.open_connection(*address)
                counts["connected"] += 1
                writer.write(b"GET /api/leaderboard HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                while time.monotonic() < until:
                    try:
                        data = await asyncio.wait_for(reader.read(4096), HEADER_GAP_S)
                    except TimeoutError:
                        writer.write(f"X-Slow-{counts['lines']}: 1\r\n".encode())
                        await writer.drain()
                        counts["lines"] += 1
                        continue
                    counts["answered 503" if data.startswith(b"HTTP/1.1 503") else "closed"] += 1
                    break
            except OSError:
                counts["refused"] += 1
            finally:
                if writer is not None:
                    writer.close()
            await asyncio.sleep(RECONNECT_S)

    await asyncio.gather(*(one(k) for k in range(SLOW_CLIENTS)))


@pytest.mark.slow
def test_a_reconnecting_slowloris_does_not_lock_out_a_player(served):
    client, _, _ = served
    base = str(client.http.base_url).rstrip("/")
    address = tuple(base.removeprefix("http://").rsplit(":", 1))
    until = time.monotonic() + ATTACK_S
    counts: Counter = Counter()
    attack = threading.Thread(
        target=asyncio.run, args=(_slowloris((address[0], int(address[1])), until, counts),)
    )
    attack.start()
    time.sleep(3)  # every slow client is connected
    polls, failures = 0, []
    while time.monotonic() < until:  # a player's page polling the leaderboard once a second
        polls += 1
        try:
            r = httpx.get(base + "/api/leaderboard", timeout=5)  # a new connection each time
            if r.status_code != 200:
                failures.append(f"{r.status_code} {r.text[:80]}")
        except httpx.HTTPError as err:
            failures.append(repr(err))
        time.sleep(1)
    attack.join(30)
    print(f"\nslowloris: {dict(counts)}; poller: {len(failures)} of {polls} failed")
    assert not attack.is_alive()
    assert not failures, f"{len(failures)} of {polls} polls failed: {failures[:5]}"
    # The attack ran: every slow client held a connection, and the server cut them and they came back.
    assert counts["connected"] >= 2 * SLOW_CLIENTS and counts["lines"] >= SLOW_CLIENTS, counts
