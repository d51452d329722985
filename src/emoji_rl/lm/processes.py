"""The job's processes, as a trainer stage (`sft`, `grpo`) starts them: joining the process group with a
collective timeout (`ProcessConfig`), checking that every process sees the run directory as one
directory, and naming the peers when a collective fails because one of them is gone.

Over several nodes (`NNODES`, docs/gpu/README.md) the global main process alone writes the run's
files, and every process reads the checkpoints back on `--resume`: a run directory that is a local
disk on each node would leave node 1 without the checkpoints node 0 wrote, found out only at the
first resume. `check_shared_dir` finds it out at the start instead.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from emoji_rl.errors import UserError
from emoji_rl.lm.training import gather, without_cuda

if TYPE_CHECKING:
    from accelerate import PartialState

# torch's own default: long enough for nodes that load or download the model at different speeds
# before their first collective.
COLLECTIVE_TIMEOUT_S = 1800


@dataclass
class ProcessConfig:
    """The field of a stage that may run in several processes (`accelerate launch`, `torchrun`)."""

    collective_timeout_s: int = field(
        default=COLLECTIVE_TIMEOUT_S,
        metadata={
            "help": "seconds a process waits in a collective (gradients, gathers, barriers) for the others "
            "before the run ends, naming them: the bound on a hang when a peer stops answering or its node "
            "is lost. A peer whose connection closes (its process died) ends the run at once"
        },
    )


@dataclass(frozen=True)
class Peer:
    """One process of the job, as the others name it."""

    rank: int
    node: int
    host: str
    pid: int

    def __str__(self) -> str:
        return f"rank {self.rank} (node {self.node}, host {self.host}, pid {self.pid})"


def _here(rank: int) -> Peer:
    # torch.distributed.run (under accelerate launch too) exports GROUP_RANK: this node's NODE_RANK.
    return Peer(rank, int(os.environ.get("GROUP_RANK", "0")), socket.gethostname(), os.getpid())


# Every process of the job, in rank order, once `join_processes` has joined them (empty in one process).
_PEERS: list[Peer] = []


def join_processes(timeout_s: int) -> PartialState:
    """Join the job's process group (a single process without a launcher), with `timeout_s` as the
    longest any collective waits. Every process calls it first."""
    from accelerate import PartialState

    if timeout_s < 1:
        raise UserError(f"collective_timeout_s={timeout_s} must be at least 1 second")
    state = PartialState(cpu=without_cuda(), timeout=timedelta(seconds=timeout_s))
    if state.num_processes > 1:
        _PEERS[:] = gather(_here(state.process_index))
    return state


def check_shared_dir(run_dir: Path, state: PartialState) -> None:
    """Check that every process sees `run_dir` as the same directory (a collective; nothing without
    other processes): the main process writes a file of its own making into it, creating it, and every
    process reads it back through its own `run_dir`. A process that cannot is named, on every process.
    Call it before anything is written to `run_dir`."""
    if state.num_processes == 1:
        return
    token = gather(uuid.uuid4().hex)[0]  # one name for all: the main process's
    probe = run_dir / f".shared-dir-check-{token}"
    if state.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
    state.wait_for_everyone()
    try:
        seen = probe.read_text() == token
    except OSError:
        seen = False
    blind = [peer for peer, ok in zip(_PEERS, gather(seen), strict=True) if not ok]
    if state.is_main_process:
        probe.unlink()
    state.wait_for_everyone()  # no process looks into run_dir while the probe is still there
    if blind:
        raise UserError(
            f"output_dir {run_dir} is not one directory shared by every node: "
            f"{', '.join(map(str, blind))} cannot read the file {_PEERS[0]} wrote there ({probe.name}). "
            "The main process alone writes checkpoints and every process reads them back on --resume: "
            "put output_dir on a filesystem every node mounts at the same path (NFS, Lustre, ...)"
        )


@contextlib.contextmanager
def peers_named(run_dir: Path, timeout_s: int) -> Iterator[None]:
    """Turn a collective that failed because a peer is gone (its connection closed, or no answer
    within `timeout_s`) into a UserError naming the processes of the other nodes: the run ends on
    this node rather than waiting forever, and says how to go on."""
    try:
        yield
    except RuntimeError as error:  # gloo raises RuntimeError, NCCL DistBackendError (a RuntimeError)
        if len(_PEERS) < 2 or not _collective_failure(error):
            raise
        import torch.distributed as dist

        me = _PEERS[dist.get_rank()]
        others = [peer for peer in _PEERS if peer.node != me.node] or [p for p in _PEERS if p != me]
        cause = str(error).strip().splitlines()[0]
        raise UserError(
            f"{me} lost its peers in a collective ({cause}): a process of another node died or did not "
            f"answer within collective_timeout_s={timeout_s}: {', '.join(map(str, others))}. Relaunch "
            f"every node with --resume true: the run goes on from its last whole checkpoint in {run_dir}"
        ) from error


def _collective_failure(error: RuntimeError) -> bool:
    """Whether `error` is a process group's failure to reach a peer, rather than a bug of this process."""
    import torch.distributed as dist

    text = str(error)
    return isinstance(error, dist.DistError) or any(
        mark in text for mark in ("gloo/transport", "Connection closed by peer", "Timed out waiting")
    )
