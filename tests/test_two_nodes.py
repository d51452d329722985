"""Two nodes on one machine, started as docs/gpu/README.md tells a user to start two boxes: the
project's own launch/train_sft.sh and launch/train_grpo.sh, twice each, NNODES=2 with NODE_RANK 0
and 1, MASTER_ADDR=127.0.0.1, one CPU process per node over gloo (GPUS=0), the tiny Qwen3.5.

One test, so that one uninterrupted run is the reference for everything else (about 2.5 minutes on
2 cores): `accelerate launch` runs SFT then GRPO with the in-process engine in one shared run
directory; one node with two processes runs the same GRPO; `torchrun` runs it again, one node is
killed mid-run and both are relaunched with --resume true; and `torchrun` SFT given a run directory
each node sees apart is stopped at the start.

tests/write_audit/sitecustomize.py, on the processes' PYTHONPATH, records what each process writes
under the run directory: only the global main process writes the run's files.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.fakes.fake_lm import FakeLM
from tests.fakes.vllm_server import FakeVLLMServer
from tests.launching import cli_args, free_port, read_weights
from tests.rl.test_distributed import SETTINGS as RL
from tests.rl.test_distributed import TARGETS
from tests.sft.conftest import PAIRS, write_chats
from tests.sft.test_distributed import SETTINGS as SFT

from emoji_rl.rl.checkpoint import TrainState
from emoji_rl.rl.rollout.collect import PromptStream

ROOT = Path(__file__).resolve().parents[1]
# The sft and grpo multi-process tests' chats, targets and SFT settings: 2 optimizer steps of 4 chats,
# 2 per node.
B, G, STEPS = 4, RL["group_size"], 6  # B: the step's prompts over both nodes, 2 each
TIMEOUT_S = 60  # collective_timeout_s: the bound on a survivor's wait
# Theirs but the batch (2 prompts per node) and the steps, rolled out in-process, checkpointed every
# other step.
GRPO = {
    **RL,
    "engine": "hf",
    "batch_size": B,
    "save_steps": 2,
    "max_steps": STEPS,
    "collective_timeout_s": TIMEOUT_S,
}


class Nodes:
    """The nodes of one job, each `launch/SCRIPT`, its output in `<tmp>/<name><node>.log`."""

    def __init__(self, tmp: Path, name: str, script: str, args: list[list[str]], **env: str) -> None:
        port = free_port()
        self.logs = [tmp / f"{name}{node}.log" for node in range(len(args))]
        self.procs = []
        for node, (node_args, log) in enumerate(zip(args, self.logs, strict=True)):
            node_env = {
                **os.environ,
                "GPUS": "0",
                "NNODES": str(len(args)),
                "NODE_RANK": str(node),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "PYTHON": sys.executable,
                # 2 processes per node at most, on 2 cores: one thread each
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(ROOT / "tests" / "write_audit"), os.environ.get("PYTHONPATH")])
                ),
                "EMOJI_RL_AUDIT_ROOT": str(tmp / "runs"),
                **env,
            }
            with log.open("w") as out:
                self.procs.append(
                    subprocess.Popen(
                        ["bash", str(ROOT / "launch" / script), *node_args],
                        cwd=ROOT,
                        env=node_env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )

    def wait(self, timeout: float = 300) -> list[str]:
        """Every node's output once all have ended; a node still running after `timeout` seconds is
        killed and fails the test."""
        deadline = time.monotonic() + timeout
        try:
            for proc in self.procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"a node hung: {[log.read_text()[-3000:] for log in self.logs]}")
        return [log.read_text() for log in self.logs]

    def kill(self, node: int | None = None) -> set[int]:
        """SIGKILL every process of `node` (of all nodes by default): its launcher and the workers it
        started, which torch elastic puts in sessions of their own. Returns their pids."""
        pids: set[int] = set()
        for proc in self.procs if node is None else [self.procs[node]]:
            if proc.poll() is None:
                tree = descendants(proc.pid)
                for pid in tree:  # stopped first, so that none goes on while the others die
                    os.kill(pid, signal.SIGSTOP)
                for pid in tree:
                    os.kill(pid, signal.SIGKILL)
                proc.wait()
                pids |= tree
        return pids


def descendants(root: int) -> set[int]:
    """`root` and every process below it, from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # after the name: state, ppid
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
    tree = {root}
    while below := {pid for pid, parent in parents.items() if parent in tree} - tree:
        tree |= below
    return tree


def audit(tmp: Path) -> list[dict]:
    return [json.loads(line) for path in tmp.glob("audit-*") for line in path.read_text().splitlines()]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "throughput/"))} for row in rows]


def adapter(run: Path) -> dict[str, torch.Tensor]:
    return read_weights(run / "adapter" / "adapter_model.safetensors")[0]


def step_batches(records: list[dict]) -> list[set[str]]:
    """Each step's B prompt ids: one seeded order, as every process draws it."""
    stream = PromptStream(records, seed=0, state=TrainState())
    return [{r["id"] for r in stream.take(B)} for _ in range(STEPS)]


@pytest.mark.slow
def test_two_nodes_train_as_one_die_apart_and_resume(tiny_qwen, smollm2_tokenizer, tmp_path):
    runs = tmp_path / "runs"
    chats = write_chats(tmp_path / "chats.jsonl", PAIRS[:32])
    records = [{"id": f"t{i}", "target": t} for i, t in enumerate(TARGETS)]
    rl_data = tmp_path / "rl.jsonl"
    rl_data.write_text("".join(json.dumps(r) + "\n" for r in records))
    sft_args = cli_args({**SFT, "model": tiny_qwen, "train_data": chats, "output_dir": runs / "sft"})

    def grpo_args(run: Path) -> list[str]:
        settings = {**GRPO, "output_dir": run, "init_adapter": runs / "sft" / "adapter"}
        return cli_args({**settings, "model": tiny_qwen, "train_data": rl_data})

    # --- accelerate: SFT, then GRPO, in one shared run directory --------------------------------------
    sft = Nodes(tmp_path, "sft", "train_sft.sh", [sft_args] * 2, CONFIG="configs/cpu/sft.yaml")
    logs = sft.wait()
    assert [p.returncode for p in sft.procs] == [0, 0], logs
    ref = runs / "grpo"
    grpo = Nodes(tmp_path, "grpo", "train_grpo.sh", [grpo_args(ref)] * 2, CONFIG="configs/cpu/grpo.yaml")
    logs = grpo.wait()
    assert [p.returncode for p in grpo.procs] == [0, 0], logs
    assert "distributed: MULTI_CPU, 2 process(es), 4 prompts per step, 2 per process" in logs[0]

    # Each file written once, by the global main process (rank 0, node 0): one line per step in the
    # logs (both nodes' local rank 0 appending would double them), one TensorBoard file, one set of
    # checkpoints (and the end: the other process wrote nothing of them).
    sft_steps = [r["step"] for r in jsonl(runs / "sft" / "metrics.jsonl") if "train/loss" in r]
    assert sft_steps == [1, 2]
    assert [m["step"] for m in jsonl(ref / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert len(list((runs / "sft" / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert len(list((ref / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert sorted(p.name for p in (ref / "checkpoints").iterdir()) == ["latest", "step-000004", "step-000006"]

    # Each process played its own prompts, the two together exactly the step's batch.
    rollouts = jsonl(ref / "rollouts.jsonl")
    for step, batch in enumerate(step_batches(records), 1):
        played = [{r["prompt_id"] for r in rollouts if r["step"] == step and r["rank"] == k} for k in (0, 1)]
        assert len(played[0]) == len(played[1]) == B // 2 and not played[0] & played[1], played
        assert played[0] | played[1] == batch
        assert sum(r["step"] == step for r in rollouts) == B * G
    assert any(m["optim/skipped"] == 0 for m in jsonl(ref / "metrics.jsonl")), "nothing trained"

    # One node with two processes, the same seed: the same adapter, bit for bit (two ranks' gradients
    # sum in the same order wherever the ranks are), and the same rollouts.
    one = Nodes(
        tmp_path, "one", "train_grpo.sh", [grpo_args(runs / "one")], NGPUS="2", CONFIG="configs/cpu/grpo.yaml"
    )
    assert one.wait() and one.procs[0].returncode == 0
    reference = adapter(ref)
    assert reference.keys() == adapter(runs / "one").keys()
    assert max((reference[k] - adapter(runs / "one")[k]).abs().max().item() for k in reference) == 0.0
    assert jsonl(runs / "one" / "rollouts.jsonl") == rollouts

    # --- accelerate: GRPO rolled out on the fake policy server, one version ahead ----------------------
    # The rollout thread draws its prompts in a gloo group of its own: made here over both nodes, and
    # bound to the interface each node reaches MASTER_ADDR through (lm/processes.py).
    served = runs / "served"
    settings = {**GRPO, "engine": "vllm", "max_off_policy_steps": 1, "max_steps": 3, "output_dir": served}
    with FakeVLLMServer(FakeLM(smollm2_tokenizer), logprobs_mode="processed_logprobs") as server:
        settings["vllm_url"] = server.url
        args = cli_args({**settings, "init_adapter": runs / "sft" / "adapter", "model": tiny_qwen})
        remote = Nodes(
            tmp_path, "served", "train_grpo.sh", [[*args, "--train_data", str(rl_data)]] * 2,
            CONFIG="configs/cpu/grpo.yaml", POLICY_API_KEY=server.api_key,
        )  # fmt: skip
        logs = remote.wait()
        completions = server.bodies("/v1/completions")
    assert [p.returncode for p in remote.procs] == [0, 0], [log[-3000:] for log in logs]
    played = jsonl(served / "rollouts.jsonl")
    for step, batch in enumerate(step_batches(records)[:3], 1):
        assert {r["prompt_id"] for r in played if r["step"] == step} == batch
        assert {r["rank"] for r in played if r["step"] == step} == {0, 1}
    assert [m["async/version_lag"] for m in jsonl(served / "metrics.jsonl")] == [0.0, 1.0, 1.0]
    # Every episode's turn was sampled there: one request a turn, from both nodes' processes.
    assert len(completions) >= sum(len(r["turns"]) for r in played) and len(played) == 3 * B * G

    # --- torchrun: GRPO again; node 1 killed mid-run ----------------------------------------------------
    run = runs / "killed"
    killed = Nodes(
        tmp_path, "killed", "train_grpo.sh", [grpo_args(run)] * 2, LAUNCHER="torchrun",
        CONFIG="configs/cpu/grpo.yaml",
    )  # fmt: skip
    while not (run / "checkpoints" / "latest").exists():
        assert killed.procs[0].poll() is None and killed.procs[1].poll() is None, killed.wait()
        time.sleep(0.05)
    lost = killed.kill(1)
    died = time.monotonic()
    survivor = killed.wait(timeout=TIMEOUT_S + 60)[0]
    # Node 0 ends by itself, well within the collective timeout, naming the process it lost.
    assert time.monotonic() - died < TIMEOUT_S, survivor
    assert killed.procs[0].returncode != 0
    host = socket.gethostname()
    assert f"rank 0 (node 0, host {host}, pid " in survivor and " lost its peers in a collective" in survivor
    named = survivor.split(f"collective_timeout_s={TIMEOUT_S}: rank 1 (node 1, host {host}, pid ", 1)[1]
    assert int(named.split(")")[0]) in lost, survivor[-3000:]
    assert "Relaunch every node with --resume true" in survivor
    assert jsonl(run / "metrics.jsonl")[-1]["step"] < STEPS and not (run / "adapter").exists()  # mid-run

    # Both relaunched with --resume true: on from the last whole checkpoint to the uninterrupted run's end.
    resumed = Nodes(
        tmp_path, "resumed", "train_grpo.sh", [[*grpo_args(run), "--resume", "true"]] * 2,
        LAUNCHER="torchrun", CONFIG="configs/cpu/grpo.yaml",
    )  # fmt: skip
    logs = resumed.wait()
    assert [p.returncode for p in resumed.procs] == [0, 0], logs
    assert "resumed from" in logs[0] and f"at step {STEPS}" not in logs[0], logs[0][-3000:]
    final = adapter(run)
    assert all(torch.equal(final[k], reference[k]) for k in reference)
    assert without_times(jsonl(run / "metrics.jsonl")) == without_times(jsonl(ref / "metrics.jsonl"))
    assert jsonl(run / "rollouts.jsonl") == rollouts

    # --- a run directory each node sees apart (each its own disk) is named at the start -------------
    # Each node looks for the main process's file for 2 s (an NFS client may show it late).
    apart = [
        cli_args(
            {
                **SFT,
                "model": tiny_qwen,
                "train_data": chats,
                "output_dir": runs / f"disk{node}",
                "shared_dir_wait_s": 2,
            }
        )
        for node in (0, 1)
    ]
    stopped = Nodes(
        tmp_path, "apart", "train_sft.sh", apart, LAUNCHER="torchrun", CONFIG="configs/cpu/sft.yaml"
    )
    logs = stopped.wait()
    assert [p.returncode != 0 for p in stopped.procs] == [True, True], logs
    for log in logs:
        assert f"output_dir {runs / 'disk'}" in log and "is not one directory shared by every node" in log
        assert f"rank 1 (node 1, host {host}, pid " in log and "cannot read the file rank 0 (node 0" in log
        assert "runtime:" not in log  # before any model loaded
    assert [list((runs / f"disk{node}").glob("*")) for node in (0, 1)] == [[], []]

    # Over every run above: no file written, directory made, renamed or removed under the run
    # directories by a process other than the global main one, but the run directory itself (every
    # process makes it: on NFS that drops a "no such directory" its node cached) and the RNG state the
    # Trainer saves per process into its checkpoint.
    written = audit(tmp_path)
    assert {e["rank"] for e in written} == {0, 1}  # the audit ran in both
    others = {(e["event"], e["path"]) for e in written if e["rank"] != 0}
    assert others <= {
        *(("os.mkdir", run) for run in ("sft", "grpo", "served", "one", "killed", "disk1")),
        *(("os.mkdir", f"sft/checkpoint-{n}") for n in (1, 2)),
        *(("open", f"sft/checkpoint-{n}/rng_state_1.pth") for n in (1, 2)),
    }, others
    mine = {e["path"] for e in written if e["rank"] == 0}
    assert {"sft/metrics.jsonl", "sft/adapter", "grpo/metrics.jsonl", "grpo/rollouts.jsonl"} <= mine
    assert {"grpo/adapter", "grpo/checkpoints/latest", "sft/checkpoint-2/trainer_state.json"} <= mine
