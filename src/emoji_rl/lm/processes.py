"""The job's processes, as a trainer stage (`sft`, `grpo`) starts them: joining the process group with a
collective timeout (`ProcessConfig`), with as many processes on every node and collective failures
raised as Python exceptions, checking that every process sees the run directory as one directory, and
naming the peers when a collective fails because one of them is gone.

Over several nodes (`NNODES`, docs/gpu/README.md) the global main process alone writes the run's
files, and every process reads the checkpoints back on `--resume`: a run directory that is a local
disk on each node would leave node 1 without the checkpoints node 0 wrote, found out only at the
first resume. `check_shared_dir` finds it out at the start instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from emoji_rl.errors import LostPeers, UserError
from emoji_rl.lm.distributed import gather, without_cuda

if TYPE_CHECKING:
    from accelerate import PartialState

log = logging.getLogger(__name__)

# torch's own default: long enough for nodes that load or download the model at different speeds
# before their first collective.
COLLECTIVE_TIMEOUT_S = 1800
# NFS's longest default attribute cache for a directory (acdirmax): how long a node may keep seeing
# the run directory as it was before the main process wrote into it.
SHARED_DIR_WAIT_S = 60
_PROBE_RETRY_S = 1.0
NCCL_ENV = {
    # ProcessGroupNCCL's CleanUpOnly: on a failed or timed-out collective its watchdog aborts the
    # communicators (which ends kernels stuck waiting for a lost peer) and leaves the process running,
    # so the next NCCL call raises DistBackendError in Python (ProcessGroupNCCL.hpp, ErrorHandlingMode).
    # torch's elastic agent exports 1 (TearDown): the watchdog kills the process, no exception.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    # No flight-recorder dump on a failure: with one, PG 0's heartbeat monitor, once signalled, sleeps
    # TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (480 s) after dumping and then aborts the process (SIGABRT,
    # no message), and the process group's destructor joins it, holding up a clean exit as long;
    # without one, the monitor waits on a condition the destructor wakes (ProcessGroupNCCL.cpp,
    # HeartbeatMonitor::runLoop).
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
}


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
    shared_dir_wait_s: int = field(
        default=SHARED_DIR_WAIT_S,
        metadata={
            "help": "seconds the processes of other nodes look for the file the main process writes into "
            "output_dir at the start before the run stops as not on a shared filesystem: an NFS client "
            "may show a directory as it was up to acdirmax (60 s by default) earlier",
            "min": 0,
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
    longest any collective waits, and check that every node runs as many processes. Every process
    calls it first."""
    from accelerate import PartialState

    if timeout_s < 1:
        raise UserError(f"collective_timeout_s={timeout_s} must be at least 1 second")
    # The process groups read these when they are made, so before PartialState makes the first: a lost
    # peer or a timeout then raises in Python, where `peers_named` names the peers once the trackers
    # are closed, and the process leaves (errors.LostPeers).
    os.environ.update(NCCL_ENV)
    if interface := gloo_interface(os.environ):
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    state = PartialState(cpu=without_cuda(), timeout=timedelta(seconds=timeout_s))
    if state.num_processes > 1:
        _PEERS[:] = gather(_here(state.process_index))
        _check_nodes_alike(_PEERS)
    return state


def gloo_interface(environ: Mapping[str, str]) -> str | None:
    """The GLOO_SOCKET_IFNAME a worker of the job described by `environ` (what torch's agent exports)
    needs: over several nodes, unless set, the interface this node reaches node 0 through. Gloo
    otherwise binds to the address the host name resolves to, 127.0.1.1 on Debian's and Ubuntu's
    /etc/hosts, which the other nodes cannot connect to: the CPU layout's process group, and on GPUs
    the rollout thread's (rl/rollout/schedule.py), would wait out their timeout. None: nothing to set."""
    if environ.get("GLOO_SOCKET_IFNAME") or int(environ.get("GROUP_WORLD_SIZE", "1")) < 2:
        return None
    master = environ.get("MASTER_ADDR", "")
    interface = interface_towards(master, int(environ.get("MASTER_PORT", "29500")))
    if interface is None:
        log.warning(
            "no network interface of this node holds the address it reaches MASTER_ADDR=%s from: gloo "
            "binds to the address %s resolves to; set GLOO_SOCKET_IFNAME to the interface the nodes "
            "share (the one holding the `src` address of `ip route get %s`: `ip -o addr show to SRC`)",
            master,
            socket.gethostname(),
            master,
        )
    return interface


def interface_towards(host: str, port: int) -> str | None:
    """The network interface this machine sends to `host` from: the one that holds the source address
    of its route there (IPv4), a secondary address included. None when there is no such route or no
    interface holds it."""
    import psutil  # accelerate's dependency

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))  # UDP: picks the route and the source address, sends nothing
            local = probe.getsockname()[0]
    except OSError:
        return None
    addresses = {
        name: [a.address for a in entries if a.family == socket.AF_INET]
        for name, entries in psutil.net_if_addrs().items()
    }
    return interface_holding(addresses, local)


def interface_holding(addresses: Mapping[str, Sequence[str]], local: str) -> str | None:
    """The interface whose IPv4 addresses (getifaddrs', every one of them: an interface's first
    address, SIOCGIFADDR's, misses a route whose source is a secondary one) include `local`. The
    names are getifaddrs', as gloo looks GLOO_SOCKET_IFNAME up (a labelled address's label)."""
    return next((name for name, held in addresses.items() if local in held), None)


def _check_nodes_alike(peers: list[Peer]) -> None:
    """Refuse nodes that run different numbers of processes. torch's agent sums whatever each node
    starts into the job, but accelerate launch's --num_processes counts the job's processes as
    NNODES equal shares, and the batch a step splits among the processes was sized for that count."""
    counts = Counter(peer.node for peer in peers)
    if len(set(counts.values())) > 1:
        each = ", ".join(f"node {node} runs {n}" for node, n in sorted(counts.items()))
        raise UserError(
            f"the nodes run unequal numbers of processes ({each}: {len(peers)} in all): start every node "
            "with the same number, one per GPU of TRAIN_GPUS (NGPUS without GPUs); accelerate launch "
            "divides --num_processes equally among --num_machines"
        )


def check_shared_dir(run_dir: Path, state: PartialState, wait_s: float) -> None:
    """Check that every process sees `run_dir` as the same directory (a collective; nothing without
    other processes): the main process writes a file of its own making into it, and every process
    reads it back through its own `run_dir`, for up to `wait_s` seconds. A process that cannot is
    named, on every process. Call it before anything is written to `run_dir`."""
    if state.num_processes == 1:
        return
    token = gather(uuid.uuid4().hex)[0]  # one name for all: the main process's
    probe = run_dir / f".shared-dir-check-{token}"
    # Every process makes it, not the main one alone: a node that looked for output_dir before the
    # main process made it (the CLI's check) may have an NFS client that serves that "no such
    # directory" from its cache for up to acdirmin (30 s); a mkdir asks the server and drops it.
    run_dir.mkdir(parents=True, exist_ok=True)
    if state.is_main_process:
        probe.write_text(token)
    state.wait_for_everyone()
    deadline = time.monotonic() + wait_s
    while True:
        # One collective a round, which every process leaves on the same verdict: all have read the
        # file, or one of them is out of time.
        views = gather((_holds(probe, token), time.monotonic() >= deadline))
        if all(seen for seen, _ in views) or any(late for _, late in views):
            break
        time.sleep(_PROBE_RETRY_S)
    blind = [peer for peer, (seen, _) in zip(_PEERS, views, strict=True) if not seen]
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


def _holds(probe: Path, token: str) -> bool:
    try:
        return probe.read_text() == token
    except OSError:
        return False


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
        raise LostPeers(
            f"{me} lost its peers in a collective ({str(error).strip().splitlines()[0]}): one of the "
            f"job's other processes died or did not answer within collective_timeout_s={timeout_s}: "
            f"{suspects(me, _PEERS)}. Relaunch every node with --resume true: the run goes on from its "
            f"last whole checkpoint in {run_dir}"
        ) from error


def suspects(me: Peer, peers: Sequence[Peer]) -> str:
    """The processes `me` may have lost, other nodes' first and this node's said to be this node's:
    the failure names no peer, and a rank that dies beside `me` breaks the collective as one on
    another node does."""
    others = [peer for peer in peers if peer.node != me.node]
    here = [peer for peer in peers if peer.node == me.node and peer != me]
    named = ", ".join(map(str, others))
    if here:
        named += ("; " if named else "") + f"on this node, {', '.join(map(str, here))}"
    return named


def _collective_failure(error: RuntimeError) -> bool:
    """Whether `error` is a process group's failure to reach a peer, rather than a bug of this process."""
    import torch.distributed as dist

    text = str(error)
    return isinstance(error, dist.DistError) or any(
        mark in text for mark in ("gloo/transport", "Connection closed by peer", "Timed out waiting")
    )
