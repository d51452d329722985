"""`make bench`'s play-web rows: the server on Starlette + uvicorn against the threaded standard-library
server it replaced (issue 47), side by side in one run, each in its own process with the same game
(no models: these pages do not reach them) and a store of answered rounds.

The threaded server is no longer in the source: it is taken from git history (`THREADED_COMMIT`,
the last commit before the move), so the rows need a git checkout with that commit.

- Requests per second on `GET /` and `GET /api/leaderboard` at concurrency 50, each request on a new
  connection (as `ab` without -k does), from a load generator on asyncio sockets in this process;
  the servers alternate and each keeps its best of `rounds` runs (other processes only slow a run).
- Idle connections held per MB of the server's resident memory: `idle` connections opened, each
  sending a request's first line and nothing more; those still open a second later, over the growth
  of the server process's RSS meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import emoji_rl
from emoji_rl.bench.row import Row

THREADED_COMMIT = "ac1c2c463a2f6a462de94b0b99dc44359fb558a3"
CONCURRENCY = 50
# Answered rounds in the store the leaderboard reads: few, so the row weighs the servers' paths
# (the thread hop, the connection) more than the leaderboard's own Python, the same code on each side.
STORED_ROUNDS = 20

# Run by each server's process with that tree's `emoji_rl` first on sys.path: the API it uses
# (Rounds, Store, make_server) is the same on both sides.
_SERVE = """
import sys
from emoji_rl.web.rounds import Rounds
from emoji_rl.web.server import make_server
from emoji_rl.web.store import Store

class NoModels:
    def stop(self):
        pass

db, rounds = sys.argv[1], int(sys.argv[2])
targets = [(f"t{i}", f"the message number {i} of the bench") for i in range(40)]
game = Rounds(Store(db), NoModels(), {"base": None}, targets, max_turns=3, tau=0.85)
for i in range(rounds):
    played = game.start_send(f"player{i % 20}")
    game.store.add_answer(played["round_id"], 1, emoji="\\U0001f355 \\U0001f3ac", text="x",
                          similarity=i / rounds, judge_guess="pizza", judge_similarity=i / rounds)
server = make_server(game, "127.0.0.1", 0)
print("serving", server.server_address[1], flush=True)
server.serve_forever()
"""


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True)


def threaded_tree(into: Path, source: Path = Path(__file__).parent) -> Path:
    """The source tree of THREADED_COMMIT under `into` (its `src`, for PYTHONPATH), from the git
    repository holding `source`."""
    top = _git("rev-parse", "--show-toplevel", cwd=source)
    if top.returncode != 0:
        raise RuntimeError(
            f"the play-web rows run the threaded server from git history (commit {THREADED_COMMIT[:10]}), "
            f"and {source} is not in a git checkout: run `make bench` from a clone of emoji-rl"
        )
    if _git("cat-file", "-e", f"{THREADED_COMMIT}^{{commit}}", cwd=source).returncode != 0:
        raise RuntimeError(
            f"the play-web rows need commit {THREADED_COMMIT[:10]} (the threaded server), which this "
            "clone lacks: a shallow clone? `git fetch --unshallow`"
        )
    archive = into / "threaded.tar"
    done = subprocess.run(
        ["git", "archive", "-o", str(archive), THREADED_COMMIT, "src/emoji_rl"],
        cwd=top.stdout.decode().strip(),
        capture_output=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"git archive {THREADED_COMMIT[:10]} failed: {done.stderr.decode()[-500:]}")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


@contextlib.contextmanager
def serving(src: Path, db: Path) -> Iterator[tuple[int, tuple[str, int]]]:
    """A play-web server from the tree `src`, in its own process: (pid, address) once it listens."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(db), str(STORED_ROUNDS)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("serving "):
            raise RuntimeError(f"the play-web server from {src} did not start (exit {proc.poll()})")
        yield proc.pid, ("127.0.0.1", int(line.split()[1]))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _get(address: tuple[str, int], path: str) -> int:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {address[0]}\r\nConnection: close\r\n\r\n".encode())
        response = await reader.read()
    finally:
        writer.close()
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.") else 0


async def _load(address: tuple[str, int], path: str, requests: int, concurrency: int) -> tuple[float, float]:
    """(requests per second, p99 latency in s) of `requests` GETs of `path`, `concurrency` at once."""
    latencies: list[float] = []
    left = iter(range(requests))

    async def client() -> None:
        for _ in left:
            start = time.perf_counter()
            status = await _get(address, path)
            if status != 200:
                raise RuntimeError(f"GET {path} answered {status or 'nothing'} under load")
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    latencies.sort()
    return requests / seconds, latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def held_per_mb(pid: int, address: tuple[str, int], idle: int) -> tuple[int, float]:
    """(connections still open a second after opening `idle` of them, their RSS growth in MB)."""
    before = _rss_mb(pid)
    socks = []
    try:
        for k in range(idle):
            sock = socket.create_connection(address, timeout=10)
            sock.sendall(b"GET / HTTP/1.1\r\n")
            socks.append(sock)
            if k % 50 == 49:  # in batches, within the threaded server's listen backlog
                time.sleep(0.02)
        time.sleep(1.0)
        grown = _rss_mb(pid) - before
        held = 0
        for sock in socks:
            sock.setblocking(False)
            try:
                sock.recv(1)  # an answer (a 503) or the end: no longer held
            except BlockingIOError:
                held += 1  # nothing to read: open, waiting for the rest of its headers
            except OSError:  # reset
                pass
        return held, grown
    finally:
        for sock in socks:
            sock.close()


def bench_play_web(
    requests: int = 2000, concurrency: int = CONCURRENCY, idle: int = 1000, rounds: int = 3
) -> list[Row]:
    new_src = Path(emoji_rl.__file__).parent.parent
    paths = ("/", "/api/leaderboard")
    best: dict[tuple[str, str], tuple[float, float]] = {}
    held: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"uvicorn": new_src, "threaded": threaded_tree(Path(tmp))}
        for k in range(rounds):
            for name, src in trees.items():
                with serving(src, Path(tmp) / f"{name}-{k}.db") as (pid, address):
                    for path in paths:
                        asyncio.run(_load(address, path, min(requests, 200), concurrency))  # warm-up
                        rate, p99 = asyncio.run(_load(address, path, requests, concurrency))
                        if rate > best.get((name, path), (0.0, 0.0))[0]:
                            best[name, path] = rate, p99
                    if name not in held:
                        held[name] = held_per_mb(pid, address, idle)
    rows = []
    for path in paths:
        (new, new_p99), (old, old_p99) = best["uvicorn", path], best["threaded", path]
        rows.append(
            Row(
                f"play-web GET {path} req/s, -c {concurrency} (asyncio client): uvicorn / threaded",
                f"{new:,.0f} (p99 {new_p99 * 1e3:.0f} ms)",
                f"{old:,.0f} (p99 {old_p99 * 1e3:.0f} ms)",
                new / old,
                ">= 1.0x",
                new >= old,
            )
        )
    # Under 0.1 MB, a growth is within what the process's other allocations move in a second.
    per_mb = {name: count / max(grown, 0.1) for name, (count, grown) in held.items()}
    rows.append(
        Row(
            f"play-web idle connections held per MB RSS ({idle} opened): uvicorn / threaded",
            f"{per_mb['uvicorn']:.0f} ({held['uvicorn'][0]} held)",
            f"{per_mb['threaded']:.0f} ({held['threaded'][0]} held)",
            per_mb["uvicorn"] / max(per_mb["threaded"], 1e-9),
            ">= 1x",
            per_mb["uvicorn"] >= per_mb["threaded"],
        )
    )
    return rows
