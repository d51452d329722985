"""A GPU box's first day, rehearsed on the CPU (issue 59): README.md's "On a GPU box" and
docs/gpu/README.md's commands, read from the docs as they are written, run in order on a simulated box
of 8 x 80 GB, and docs/gpu/README.md's two-node block on two such boxes; then the defects that past
readings found, planted back one at a time, each of which the rehearsal must catch.

The launchers, the Makefile, with_servers.sh, gpu_smoke.sh and the pipeline runner run for real;
every GPU program is a stand-in (tests/rehearsal/shims.py, standins.py, stages.py).
"""

from __future__ import annotations

import fcntl
import socket
from pathlib import Path

import pytest
from tests.rehearsal.runner import Command, Rehearsal, RehearsalFailure, commands, own_address

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
GPU_DOC = (ROOT / "docs" / "gpu" / "README.md").read_text()
PORTS = (8001, 8002, 29500)  # the docs' judge, policy server and rendezvous ports


@pytest.fixture
def machine(tmp_path_factory):
    """The docs' ports to this rehearsal alone (one rehearsal at a time, whatever the test workers)."""
    with open(tmp_path_factory.getbasetemp().parent / "emoji-rl-rehearsal.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for port in PORTS:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    pytest.fail(
                        f"port {port} is in use on this machine: the rehearsal serves the docs' own ports"
                    )
        yield
        fcntl.flock(lock, fcntl.LOCK_UN)


def readme_blocks(readme: str = README) -> list[list[Command]]:
    return commands(readme, "README.md", "On a GPU box")


def one_node_blocks(gpu_doc: str = GPU_DOC) -> list[list[Command]]:
    return [block for block in commands(gpu_doc, "docs/gpu/README.md") if not any(c.node for c in block)]


def setup_line() -> Command:
    [setup] = [c for c in readme_blocks()[0] if c.text.startswith("make setup")]
    return setup


def data_lines(gpu_doc: str = GPU_DOC) -> list[Command]:
    """Step by step's first two lines, which make the data: where the two-node block starts."""
    return commands(gpu_doc, "docs/gpu/README.md", "Step by step")[0][:2]


def two_node_flow(rehearsal: Rehearsal, gpu_doc: str = GPU_DOC) -> None:
    [two_nodes] = [block for block in commands(gpu_doc, "docs/gpu/README.md") if any(c.node for c in block)]
    rehearsal.block([setup_line(), *data_lines(gpu_doc)])
    rehearsal.block(two_nodes)


def test_the_gpu_docs_take_a_fresh_box_to_a_trained_adapter(tmp_path, machine):
    with Rehearsal(tmp_path / "one") as one:
        for block in readme_blocks() + one_node_blocks():
            one.block(block)
    runs = one.repo / "runs"
    for run in ("experiment-gpu/grpo", "grpo-gpu", "grpo-k2"):
        assert (runs / run / "adapter" / "adapter_config.json").is_file(), run
    assert (runs / "experiment-gpu" / "report.md").is_file()
    [box] = one.boxes
    started = [r for r in box.records if r["kind"] == "stage"]
    # Every stage of the experiment ran, and each trainer on the GPUs the layout gives it.
    assert [r["stage"] for r in started].count("grpo") == 4  # gpu_smoke, experiment, step by step, K = 2
    assert {tuple(r["gpus"]) for r in started if r["stage"] == "grpo"} == {(4, 5, 6, 7)}
    assert {tuple(r["gpus"]) for r in started if r["stage"] == "sft"} == {tuple(range(8))}
    [build] = [r for r in box.records if r["kind"] == "pip" and "--no-build-isolation" in r["argv"]]
    assert build["env"]["FLASH_ATTN_CUDA_ARCHS"] == "90" and build["env"]["TORCH_CUDA_ARCH_LIST"] == "9.0"

    if own_address() is None:
        pytest.skip("no network address on this machine for node 0: the two-node block needs one")
    with Rehearsal(tmp_path / "two", nodes=2) as two:
        two_node_flow(two)
    grpo = [[r for r in box.records if r.get("stage") == "grpo"] for box in two.boxes]
    assert [[r["world"] for r in node] for node in grpo] == [[8], [8]]
    assert [r["ranks"] for r in grpo[1]] == [[4, 5, 6, 7]]
    assert (two.repo / "runs" / "grpo-gpu" / "adapter").is_dir()


# --- the defects past readings found, planted back --------------------------------------------------------


def line(text: str) -> Command:
    return Command(text, "planted")


def rehearse(tmp_path, blocks: list[list[Command]], nodes: int = 1, **patches: tuple[str, str]) -> str:
    """The rehearsal's failure on `blocks`, with `patches` (file -> (text, replacement)) planted."""
    with pytest.raises(RehearsalFailure) as failed, Rehearsal(tmp_path, nodes, patches=patches) as rehearsal:
        for block in blocks:
            rehearsal.block(block)
    return str(failed.value)


def test_steps_that_skip_the_data_fail_at_the_first_stage_without_its_input(tmp_path, machine):
    # Point 4: the steps as the README gave them, SFT first on a box that has no data yet.
    [steps] = commands(GPU_DOC, "docs/gpu/README.md", "Step by step")
    failure = rehearse(tmp_path, [[setup_line(), *steps[2:]]])
    assert "`make sft PROFILE=gpu " in failure
    assert (
        "sft started without its inputs: train_data=data/sft_train.jsonl, eval_data=data/sft_test.jsonl"
        in failure
    )


SERVERS_BY_HAND = [line("make serve-judge PROFILE=gpu   # (another shell)")]


def test_sft_beside_servers_started_by_hand_fails(tmp_path, machine):
    # Point 2: servers started in another shell, then SFT on every GPU. As it was, SFT's ranks claim
    # GPUs where vLLM holds 90%; now train_sft.sh refuses, naming them.
    steps = [[setup_line(), *data_lines(), *SERVERS_BY_HAND, line("make sft PROFILE=gpu")]]
    unchecked = {"launch/train_sft.sh": ('require_free_gpus "${TRAIN_GPUS:-all}"\n', "")}
    failure = rehearse(tmp_path / "planted", steps, **unchecked)
    assert "broke the box" in failure and "emoji-rl sft (pid " in failure
    assert "MiB of GPU 0, where pid " in failure and "vllm serve judge" in failure
    failure = rehearse(tmp_path / "now", steps)
    assert "`make sft PROFILE=gpu` (node 0) exited with 2" in failure
    assert "train_sft.sh: GPU 0,1 already in use" in failure and "GPUs free now (2,3,4,5,6,7)" in failure


def test_the_smoke_test_beside_a_server_started_by_hand_fails(tmp_path, machine):
    # Point 2: gpu_smoke.sh's own judge dies on the taken port while the stranger answers its /health.
    steps = [[setup_line(), *SERVERS_BY_HAND, line("launch/gpu_smoke.sh")]]
    unchecked = {"launch/gpu_smoke.sh": ('  if "$PYTHON" -m emoji_rl.io.endpoint "$3" --once', "  if false")}
    failure = rehearse(tmp_path / "planted", steps, **unchecked)
    assert "could not bind 127.0.0.1:8001" in failure
    failure = rehearse(tmp_path / "now", steps)
    assert (
        "`launch/gpu_smoke.sh` (node 0) exited with 1" in failure and "a server already answers at" in failure
    )


@pytest.mark.skipif(own_address() is None, reason="no network address on this machine for node 0")
def test_a_stage_not_told_where_its_servers_listen_fails(tmp_path, machine):
    # Point 1: with_servers.sh found node 0's servers at 10.0.0.1 and ran the stage as it was, whose
    # judge_url stayed 127.0.0.1:8001.
    with pytest.raises(RehearsalFailure) as failed, Rehearsal(tmp_path, nodes=2, patches={
        "launch/with_servers.sh": ('COMMAND+=("${SERVER_FLAGS[@]}")', ":"),
    }) as rehearsal:  # fmt: skip
        two_node_flow(rehearsal)
    failure = str(failed.value)
    assert "launch/with_servers.sh judge,policy -- launch/train_grpo.sh` (node 0)" in failure
    assert (
        "emoji-rl grpo is not pointed at its judge server: http://127.0.0.1:8001 does not answer" in failure
    )


@pytest.mark.skipif(own_address() is None, reason="no network address on this machine for node 0")
def test_nodes_that_run_unequal_numbers_of_processes_fail(tmp_path, machine):
    # Last time's world of 12: node 1 trained on all 8 GPUs beside node 0's 4.
    planted = GPU_DOC.replace("TRAIN_GPUS=0,1,2,3 \\", "TRAIN_GPUS=0,1,2,3,4,5,6,7 \\")
    assert planted != GPU_DOC
    with pytest.raises(RehearsalFailure) as failed, Rehearsal(tmp_path, nodes=2) as rehearsal:
        two_node_flow(rehearsal, planted)
    failure = str(failed.value)
    assert "the nodes disagree on the world size" in failure
    assert "(accelerate --num_processes 16), torch's agent made 12" in failure
