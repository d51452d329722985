"""The GPU docs' commands as they are written, run in order on simulated boxes.

A doc's commands are the lines of its ```bash blocks (a line ending in a backslash goes on), each run
by bash in a copy of the repository, as a user types them. A command whose comment says "(another
shell)" starts in the background and is stopped (Ctrl-C) when its block ends. In a block that says
`# node 0` and `# node 1`, the lines after each run on that node; a line with NNODES=2 is one node's
part of a job, and the nodes' parts of a job start together, as two users would start them; node 0's
lines between two jobs run in order before the next. The docs' node 0 address, 10.0.0.1, is this
machine's own address here (the two nodes share it), and the servers' and the rendezvous' ports are
those the docs give: they must be free on this machine.

After every command, any violation the boxes found fails the rehearsal, naming the command, and so
does a command that exits non-zero.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.rehearsal import shims, standins
from tests.rehearsal.box import Box, fresh_env

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("Makefile", "pyproject.toml", "launch", "configs", "requirements", "data")
DOC_ADDRESS = "10.0.0.1"
COMMAND_S = 120


class RehearsalFailure(AssertionError):
    pass


@dataclass
class Command:
    text: str
    where: str
    node: int = 0

    @property
    def background(self) -> bool:
        return "(another shell)" in self.text

    @property
    def job(self) -> bool:
        return bool(re.search(r"\bNNODES=[2-9]", self.text))


def commands(text: str, source: str, heading: str | None = None) -> list[list[Command]]:
    """The ```bash blocks of `text` (under `## heading` only, if given), each a list of commands."""
    start = 0
    if heading is not None:
        start = text.index(f"\n## {heading}\n")
        end = text.find("\n## ", start + 1)
        text = text[: end if end != -1 else len(text)]
    blocks = []
    for match in re.finditer(r"```bash\n(.*?)```", text[start:], re.S):
        line_no = text[: start + match.start(1)].count("\n") + 1
        node, block, pending, first = 0, [], "", line_no
        for i, line in enumerate(match.group(1).splitlines()):
            if not pending:
                first = line_no + i
            if m := re.fullmatch(r"\s*# node (\d+)\s*", line):
                node = int(m.group(1))
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            line, pending = pending + line, ""
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            block.append(Command(line.strip(), f"{source}:{first}", node))
        blocks.append(block)
    return blocks


def own_address() -> str | None:
    """This machine's IPv4 address on a network (what node 0's address is to the other node), or None."""
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


@dataclass
class Rehearsal:
    """Boxes of `nodes` nodes over one copy of the repository (the run directory every node mounts)."""

    tmp: Path
    nodes: int = 1
    env: dict[str, str] = field(default_factory=dict)
    """Settings every node's shell has, as a user's exports."""
    patches: dict[str, tuple[str, str]] = field(default_factory=dict)
    """A planted defect: file of the copy -> (text, replacement)."""
    log: list[str] = field(default_factory=list)

    def __enter__(self) -> Rehearsal:
        self.repo = self.tmp / "repo"
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, self.repo / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                self.repo.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, self.repo / name)
        for name, (old, new) in self.patches.items():
            path = self.repo / name
            assert old in path.read_text(), f"the planted defect's text is not in {name}"
            path.write_text(path.read_text().replace(old, new))
        bin_dir = shims.path_dir(self.tmp / "bin")
        self.boxes = [Box(self.tmp, node).start(standins.handle) for node in range(self.nodes)]
        self.envs = [
            fresh_env(box, [bin_dir], ANTHROPIC_API_KEY="rehearsal", **self.env) for box in self.boxes
        ]
        self.background: list[subprocess.Popen] = []
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_background()
        standins.stop_servers()
        for box in self.boxes:
            box.stop()

    # --- running ----------------------------------------------------------------------------------------

    def start(self, command: Command) -> subprocess.Popen:
        text = command.text.replace(DOC_ADDRESS, own_address() or DOC_ADDRESS)
        self.log.append(f"[node {command.node}] $ {text}")
        return subprocess.Popen(
            ["bash", "-c", text], cwd=self.repo, env=self.envs[command.node], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip

    def finish(self, command: Command, process: subprocess.Popen) -> None:
        try:
            output, _ = process.communicate(timeout=COMMAND_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            self.fail(command, f"did not end within {COMMAND_S} s (a server? say '(another shell)')", output)
        self.log.append(output)
        self.check(command, output)
        if process.returncode != 0:
            self.fail(command, f"exited with {process.returncode}", output)

    def check(self, command: Command, output: str = "") -> None:
        violations = [v for box in self.boxes for v in box.violations]
        if violations:
            self.fail(command, "broke the box:\n  " + "\n  ".join(violations), output)

    def fail(self, command: Command, what: str, output: str) -> None:
        tail = "\n".join(output.splitlines()[-25:])
        raise RehearsalFailure(f"{command.where}: `{command.text}` (node {command.node}) {what}\n{tail}")

    def stop_background(self) -> None:
        for process in self.background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in its shell
        for process in self.background:
            try:
                process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        self.background = []

    def block(self, block: list[Command]) -> None:
        """One ```bash block: on one node in order, or its nodes' jobs together."""
        queues = {node: [c for c in block if c.node == node] for node in sorted({c.node for c in block})}
        while any(queues.values()):
            # Each node's commands up to its next job, in order; then the jobs, every node's at once.
            for queue in queues.values():
                while queue and not (queue[0].job and len(queues) > 1):
                    self.one(queue.pop(0))
            jobs = [queue.pop(0) for queue in queues.values() if queue]
            started = [(command, self.start(command)) for command in jobs]
            for command, process in started:
                self.finish(command, process)
        self.stop_background()

    def one(self, command: Command) -> None:
        if command.background:
            # A server in another shell: the user goes on once it says it serves (or it ended).
            serving = len(standins.SERVED)
            process = self.start(command)
            self.background.append(process)
            deadline = time.monotonic() + 30
            while len(standins.SERVED) == serving and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            self.check(command)
        else:
            self.finish(command, self.start(command))
