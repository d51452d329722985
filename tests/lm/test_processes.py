"""lm/processes.py and the rollout thread's process group in the processes a launcher starts: two CPU
processes over gloo under `accelerate launch`, which starts them through torch's elastic agent as on a
GPU box. One job (the `job` fixture) runs every multi-process check below; the interface lookup runs
here, against what iproute2 reports.

Run as a script (the fixture does, under accelerate launch), this file is one rank of that job: it
writes what it saw to `<out>/rank<N>.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.launching import accelerate_launch

from emoji_rl.errors import LostPeers
from emoji_rl.lm.processes import Peer

RANKS = 2
LATE_S = 1.0  # how much later node 1's view of the run directory shows the main process's file
APART_WAIT_S = 1.5  # shared_dir_wait_s for the directory the nodes see apart
GROUP_TIMEOUT_S = 2  # collective_timeout_s the rollout thread's group is made with


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Each rank's record of the job below, launched once for the module's tests."""
    out = tmp_path_factory.mktemp("processes")
    done = accelerate_launch(__file__, [str(out)], processes=RANKS, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(RANKS)]


def test_nccl_errors_are_left_to_raise_in_python_not_to_kill_the_process(job):
    # torch's elastic agent exports 1 (TearDown: the watchdog aborts the process, no exception); the
    # process group is made with 2 (CleanUpOnly: the communicators are aborted, and their next use
    # raises DistBackendError, which peers_named turns into the message naming the lost peers), and
    # without the flight recorder's dump, whose heartbeat monitor would sleep 480 s and then SIGABRT.
    assert [r["nccl_error_handling"]["exported"] for r in job] == ["1", "1"]
    assert [r["nccl_error_handling"]["at_init_process_group"] for r in job] == ["2", "2"]
    assert [r["nccl_error_handling"]["dump_on_timeout"] for r in job] == ["0", "0"]


PEERS = [Peer(0, 0, "gpu1", 100), Peer(1, 0, "gpu1", 101), Peer(2, 1, "gpu2", 200), Peer(3, 1, "gpu2", 201)]


def test_a_lost_peer_is_named_among_every_process_this_one_may_have_lost(monkeypatch, tmp_path):
    # A rank dead beside rank 0 breaks its collective as one on node 1 does: the failure names no
    # peer, so the message names them all, this node's said to be this node's.
    import torch.distributed as dist

    from emoji_rl.lm import processes

    monkeypatch.setattr(processes, "_PEERS", PEERS)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    with pytest.raises(LostPeers) as lost, processes.peers_named(tmp_path, 60):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    message = str(lost.value)
    assert message.startswith("rank 0 (node 0, host gpu1, pid 100) lost its peers in a collective (")
    assert (
        "one of the job's other processes died or did not answer within collective_timeout_s=60: " in message
    )
    assert (
        "rank 2 (node 1, host gpu2, pid 200), rank 3 (node 1, host gpu2, pid 201); "
        "on this node, rank 1 (node 0, host gpu1, pid 101). Relaunch every node with --resume true" in message
    )
    assert "another node" not in message


def test_a_lost_peer_ends_the_process_once_its_message_is_out(monkeypatch, capsys, tmp_path):
    # NCCL's threads would hold up the interpreter's exit (the flight recorder's monitor, a watchdog
    # asleep 60 s after a failure): the CLI prints the message and leaves.
    from emoji_rl import cli
    from emoji_rl.eval import human

    left = []

    def lose(cfg):
        raise LostPeers("rank 0 (node 0, host gpu1, pid 100) lost its peers in a collective")

    monkeypatch.setattr(human, "main", lose)
    monkeypatch.setattr(os, "_exit", lambda status: left.append(status) or sys.exit(status))
    with pytest.raises(SystemExit):
        cli.main(["eval-human", "--output_dir", str(tmp_path)])
    assert left == [2]
    assert (
        "emoji-rl eval-human: error: rank 0 (node 0, host gpu1, pid 100) lost its peers"
        in capsys.readouterr().err
    )


def test_a_node_that_sees_the_main_process_file_late_passes_and_makes_the_directory_itself(job):
    # Rank 1's view of the run directory is a directory of its own that shows the main process's file
    # LATE_S seconds after it was written (an NFS client's cached lookup) and only once rank 1 has made
    # the directory (the copy into it fails otherwise).
    assert [r["late_view"]["error"] for r in job] == [None, None]
    assert job[1]["late_view"]["made"] and job[1]["late_view"]["copied"]


def test_a_directory_the_nodes_see_apart_is_named_after_shared_dir_wait_s(job):
    for record in job:
        apart = record["apart"]
        assert "is not one directory shared by every node" in apart["error"]
        assert "rank 1 (node 0, host " in apart["error"]  # the one that could not read the file
        assert APART_WAIT_S <= apart["seconds"] < APART_WAIT_S + 10


def test_the_rollout_threads_group_gives_up_after_collective_timeout_s_not_glooss_30_minutes(job):
    # Rank 1 never joins the collective: rank 0 waits GROUP_TIMEOUT_S, then gloo raises.
    waited = job[0]["rollout_group"]
    assert waited["error"] is not None and "Timed out" in waited["error"], waited
    assert GROUP_TIMEOUT_S <= waited["seconds"] < GROUP_TIMEOUT_S + 5


def test_the_gloo_interface_of_several_nodes_is_the_one_that_reaches_node_0(monkeypatch):
    from emoji_rl.lm.processes import gloo_interface, interface_towards

    # iproute2 is the judge: every IPv4 address of this machine is reached through its own interface.
    ip = shutil.which("ip")
    listed = subprocess.run([ip, "-j", "-4", "addr"], capture_output=True, text=True) if ip else None
    if listed is None or listed.returncode != 0:
        pytest.skip("needs iproute2's `ip -j`")
    addresses = [
        (link["ifname"], info["local"]) for link in json.loads(listed.stdout) for info in link["addr_info"]
    ]
    assert ("lo", "127.0.0.1") in addresses
    found = {address: interface_towards(address, 29500) for _, address in addresses}
    assert found == {address: name for name, address in addresses}
    # One node, or a GLOO_SOCKET_IFNAME already set: nothing to choose.
    two_nodes = {"GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert gloo_interface(two_nodes) == "lo"
    assert gloo_interface({**two_nodes, "GROUP_WORLD_SIZE": "1"}) is None
    assert gloo_interface({**two_nodes, "GLOO_SOCKET_IFNAME": "eth7"}) is None


def test_a_route_from_a_secondary_address_finds_the_interface_that_holds_it():
    # What getifaddrs lists on node 0 with its cluster address 10.0.0.1 added beside eth0's own, and a
    # VIP on bond0: the interface's first address (SIOCGIFADDR's) is not the route's source.
    from emoji_rl.lm.processes import interface_holding

    listed = {"lo": ["127.0.0.1"], "eth0": ["192.0.2.2", "10.0.0.1"], "bond0": ["10.1.0.2", "10.1.0.9"]}
    assert interface_holding(listed, "10.0.0.1") == "eth0"
    assert interface_holding(listed, "10.1.0.9") == "bond0"
    assert interface_holding(listed, "10.9.9.9") is None


NAMESPACE = """
set -e
ip link set lo up
ip addr add 10.0.0.1/8 dev lo                 # node 0's own cluster address, a second one on lo
ip link add v0 type veth peer name v1
ip addr add 10.1.0.2/24 dev v0
ip addr add 10.1.0.9/24 dev v0                # a secondary address (a VIP)
ip link set v0 up; ip link set v1 up
ip route add 10.2.0.0/24 dev v0 src 10.1.0.9  # the route to node 0 leaves from the VIP
exec "$PYTHON" -c 'from emoji_rl.lm.processes import interface_towards as at
print(at("10.0.0.1", 29500), at("10.2.0.1", 29500), at("10.1.0.5", 29500))'
"""


def test_the_interface_is_found_for_a_secondary_address_in_a_network_namespace():
    # Real addresses in a network namespace of this test's own (unshare: root, or user namespaces).
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare, "-rn", "true"], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0 or shutil.which("ip") is None:
        pytest.skip("needs unshare -rn (network namespaces) and iproute2")
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        [unshare, "-rn", "bash", "-c", NAMESPACE], capture_output=True, text=True, env=env, timeout=60
    )
    if "Operation not permitted" in result.stderr:
        pytest.skip(f"no network namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["lo", "v0", "v0"]


# --- one rank of the job ---------------------------------------------------------------------------------


def _timed(call) -> dict[str, object]:
    """`call()`'s seconds and the error it raised (None if it returned)."""
    start = time.monotonic()
    try:
        call()
        error = None
    except Exception as err:  # recorded for the test to read
        error = f"{type(err).__name__}: {err}"
    return {"seconds": time.monotonic() - start, "error": error}


def _late_copy(source: Path, view: Path, copied: list[bool]) -> None:
    """Node 1's view of `source`: the main process's file appears in `view` LATE_S after it appeared
    in `source`; `view` is not made here (rank 1 must have made it)."""
    while not (probes := list(source.glob(".shared-dir-check-*"))):
        time.sleep(0.02)
    time.sleep(LATE_S)
    shutil.copy(probes[0], view / probes[0].name)
    copied.append(True)


def _rank(out: Path) -> None:
    import torch
    import torch.distributed as dist

    from emoji_rl.lm import processes
    from emoji_rl.rl.rollout.schedule import rollout_group

    nccl = {"exported": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")}
    init = dist.init_process_group

    def init_spy(*args, **kwargs):
        nccl["at_init_process_group"] = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
        nccl["dump_on_timeout"] = os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT")
        return init(*args, **kwargs)

    dist.init_process_group = init_spy
    state = processes.join_processes(60)
    rank = state.process_index
    record: dict[str, object] = {"nccl_error_handling": nccl}

    view, copied = out / ("shared" if rank == 0 else "view1"), []
    if rank == 1:
        threading.Thread(target=_late_copy, args=(out / "shared", view, copied), daemon=True).start()
    record["late_view"] = {
        **_timed(lambda: processes.check_shared_dir(view, state, 10)),
        "made": view.is_dir(),
        "copied": bool(copied),
    }
    record["apart"] = _timed(lambda: processes.check_shared_dir(out / f"apart{rank}", state, APART_WAIT_S))

    # Last: rank 0 is left with a broken group. Rank 1 stays alive, its connection open, well past
    # rank 0's wait, then exits, which ends a wait with no timeout of its own.
    group = rollout_group(GROUP_TIMEOUT_S)
    if rank == 0:
        record["rollout_group"] = _timed(lambda: dist.all_reduce(torch.zeros(1), group=group))
    else:
        time.sleep(GROUP_TIMEOUT_S + 10)
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _rank(Path(sys.argv[1]))
    # Leave as the CLI does after a lost peer (cli.leave): the interpreter's teardown of the broken
    # group may find a gloo thread still running and abort the rank ("terminate called without an
    # active exception": once in CI, on a loaded machine, after every record was written).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
