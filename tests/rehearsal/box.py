"""One simulated node: 8 GPUs of 80 GB, the processes that hold their memory, and what the rehearsal
found wrong. Its stand-ins (client.py) reach it over a unix socket; each request runs in a thread of
this test process, which already has torch, accelerate and emoji_rl imported, so a stand-in costs a
few milliseconds, not an interpreter's start-up.

A violation is what fails the rehearsal even when every command exits 0: two processes that claim
more memory than a GPU has, a stage started without its inputs or pointed at a server that is not
there, nodes that disagree on the job's size, a CUDA build that would take hours.
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CARD_MIB = 81559
"""An H100 80GB HBM3's memory as nvidia-smi reports it."""
CARD_NAME = "NVIDIA H100 80GB HBM3"
COMPUTE_CAP = "9.0"


def gb_to_mib(gb: float) -> int:
    return round(gb * 1e9 / 2**20)


@dataclass
class Holder:
    """A stand-in holding GPU memory: a server until it is stopped, a trainer's rank while it runs."""

    pid: int
    name: str
    mib: dict[int, int]
    """GPU -> MiB."""


@dataclass
class Reply:
    """What a stand-in says back to its process: lines for its stdout and stderr."""

    send: Callable[[dict], None]

    def out(self, text: str) -> None:
        self.send({"stdout": text if text.endswith("\n") else text + "\n"})

    def err(self, text: str) -> None:
        self.send({"stderr": text if text.endswith("\n") else text + "\n"})


@dataclass
class Box:
    root: Path
    node: int
    gpus: int = 8
    holders: list[Holder] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    """Every stand-in's start: its kind, command, GPUs, memory and the environment it was given."""
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self.socket = self.root / f"node{self.node}.sock"
        self._server: socketserver.ThreadingUnixStreamServer | None = None

    # --- the socket ---------------------------------------------------------------------------------

    def start(
        self, handle: Callable[[Box, dict, Reply, socketserver.StreamRequestHandler], int | None]
    ) -> Box:
        box = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                request = json.loads(self.rfile.readline())

                def send(message: dict) -> None:
                    try:
                        self.wfile.write(json.dumps(message).encode() + b"\n")
                        self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the process was killed: what it would have printed goes nowhere

                reply = Reply(send)
                try:
                    code = handle(box, request, reply, self)
                except Exception as err:  # a bug of the rehearsal, or a stand-in's check that raised
                    box.violate(f"{request['kind']} stand-in crashed: {type(err).__name__}: {err}")
                    code = 1
                if code is not None:
                    send({"exit": code})

        self.socket.unlink(missing_ok=True)
        self._server = socketserver.ThreadingUnixStreamServer(str(self.socket), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # --- what it found ------------------------------------------------------------------------------

    def violate(self, message: str) -> None:
        with self.lock:
            self.violations.append(f"node {self.node}: {message}")

    def record(self, **entry: object) -> None:
        with self.lock:
            self.records.append(entry)

    # --- GPU memory ---------------------------------------------------------------------------------

    def used(self, gpu: int) -> int:
        return sum(holder.mib.get(gpu, 0) for holder in self.holders)

    def claim(self, pid: int, name: str, mib: dict[int, int]) -> list[str]:
        """Hold `mib` on each GPU for `pid`, or say (and count as a violation) which GPUs lack it."""
        with self.lock:
            self.reap()
            short = []
            for gpu, want in sorted(mib.items()):
                if gpu >= self.gpus:
                    short.append(f"GPU {gpu} does not exist: the box has GPUs 0-{self.gpus - 1}")
                elif self.used(gpu) + want > CARD_MIB:
                    others = ", ".join(
                        f"pid {h.pid} {h.name} {h.mib[gpu]:,} MiB" for h in self.holders if gpu in h.mib
                    )
                    short.append(
                        f"{name} (pid {pid}) claims {want:,} MiB of GPU {gpu}, where {others} already hold "
                        f"{self.used(gpu):,} of {CARD_MIB:,} MiB"
                    )
            for message in short:
                self.violate(message)
            if not short:
                self.holders.append(Holder(pid, name, dict(mib)))
            return short

    def release(self, pid: int) -> None:
        with self.lock:
            self.holders = [holder for holder in self.holders if holder.pid != pid]

    def reap(self) -> None:
        """Forget holders whose process is gone (killed by the script that started it)."""
        with self.lock:
            self.holders = [holder for holder in self.holders if alive(holder.pid)]

    def nvidia_smi(self, args: list[str]) -> tuple[str, int]:
        """nvidia-smi's answer to `args`: --list-gpus, --query-gpu, --query-compute-apps."""
        self.reap()
        uuid = [f"GPU-{self.node:04x}{gpu:04x}-0000-0000-0000-000000000000" for gpu in range(self.gpus)]
        query = next((a.split("=", 1) for a in args if a.startswith("--query-")), None)
        if "--list-gpus" in args or "-L" in args:
            return "".join(f"GPU {g}: {CARD_NAME} (UUID: {uuid[g]})\n" for g in range(self.gpus)), 0
        if query is None:
            lines = [f"| {g}  {CARD_NAME}  {self.used(g):>6}MiB / {CARD_MIB}MiB |" for g in range(self.gpus)]
            return "\n".join(lines) + "\n", 0
        kind, fields = query[0], query[1].split(",")
        with self.lock:
            if kind == "--query-gpu":
                values = {
                    "index": lambda g: str(g),
                    "uuid": lambda g: uuid[g],
                    "name": lambda g: CARD_NAME,
                    "memory.used": lambda g: str(self.used(g)),
                    "memory.total": lambda g: str(CARD_MIB),
                    "memory.free": lambda g: str(CARD_MIB - self.used(g)),
                    "compute_cap": lambda g: COMPUTE_CAP,
                }
                rows = [[values[f](g) for f in fields] for g in range(self.gpus)]
            elif kind == "--query-compute-apps":
                values = {
                    "gpu_uuid": lambda h, g: uuid[g],
                    "pid": lambda h, g: str(h.pid),
                    "process_name": lambda h, g: h.name,
                    "used_memory": lambda h, g: str(h.mib[g]),
                }
                rows = [[values[f](h, g) for f in fields] for h in self.holders for g in sorted(h.mib)]
            else:
                return f"nvidia-smi: {kind} is not simulated\n", 2
        return "".join(", ".join(row) + "\n" for row in rows), 0


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet waited for, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def fresh_env(box: Box, path: list[Path], **settings: str) -> dict[str, str]:
    """The environment of a shell on `box`: its programs first on PATH, a home of its own, and this
    repository's code on the path of every python (what `pip install -e .` gives a real box)."""
    src = Path(__file__).resolve().parents[2] / "src"
    return {
        "PATH": os.pathsep.join([*map(str, path), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(box.root / f"home{box.node}"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(src),
        "REHEARSAL_BOX": str(box.socket),
        **settings,
    }
