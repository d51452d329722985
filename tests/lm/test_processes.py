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
    # raises DistBackendError, which peers_named turns into the message naming the lost peers).
    assert [r["nccl_error_handling"]["exported"] for r in job] == ["1", "1"]
    assert [r["nccl_error_handling"]["at_init_process_group"] for r in job] == ["2", "2"]


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
