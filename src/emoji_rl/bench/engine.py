"""A vLLM server on the CPU engine (`make setup-vllm-engine`), started by one of the project's launch
scripts in its own process group and waited for until `/health` answers: what `make bench`'s engine
rows and the tests marked `vllm_engine` serve from."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from emoji_rl.io.endpoint import Endpoint

ROOT = Path(__file__).resolve().parents[3]
ENGINE_VENV = ROOT / ".venv-vllm-engine"
START_S = 600


class ServerFailed(RuntimeError):
    """The script exited, or the server never answered; the message ends with its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def engine_env(**extra: str) -> dict[str, str]:
    """The environment the launch scripts get for the CPU layout with the engine's venv."""
    return {
        **os.environ,
        "GPUS": "0",
        "PYTHON": sys.executable,
        "VLLM": str(ENGINE_VENV / "bin" / "vllm"),
        **extra,
    }


@dataclass
class Server:
    """A `vllm serve` started by a launch script, in its own process group."""

    url: str
    log: Path
    process: subprocess.Popen

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL to the whole group: the API server and the engine die at once, as in a crash."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL if it is still there after 30 s."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def start_server(
    script: str,
    log: Path,
    env: dict[str, str],
    *args: str,
    port_var: str = "POLICY_PORT",
    port: int = 0,
    prefix: tuple[str, ...] = (),
) -> Server:
    """`prefix launch/<script> args` with `env` on `port` (0: a free one), waited for until /health
    answers; `ServerFailed` with its log if it dies first or stays silent for `START_S`."""
    port = port or free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(
            [*prefix, "bash", str(ROOT / "launch" / script), *args],
            cwd=ROOT,
            env={**env, port_var: str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", log, process)
    start = time.monotonic()
    while time.monotonic() - start < START_S:
        if process.poll() is not None:
            raise ServerFailed(
                f"{script} exited ({process.returncode}) before answering:\n{server.log_tail()}"
            )
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return server
        time.sleep(2)
    server.stop()
    raise ServerFailed(f"{script} gave no answer at {server.url}/health in {START_S} s:\n{server.log_tail()}")


def server_parser(prog: str, description: str, model_help: str) -> argparse.ArgumentParser:
    """The arguments of a bench played against a running server (launch/gpu_smoke.sh's stages)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8002")
    parser.add_argument("--model", default="policy", help=model_help)
    parser.add_argument("--api_key_env", default=None, help="environment variable holding its key")
    return parser


def server_endpoint(args: argparse.Namespace) -> Endpoint:
    return Endpoint(args.url, args.api_key_env, timeout_s=600.0)
