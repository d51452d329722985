"""The launchers beside servers already running (issue 59, points 1 and 2): with_servers.sh tells its
command where the servers listen, gpu_smoke.sh fails a server whose port something already answers
on rather than pass the stranger, and a trainer refuses GPUs that nvidia-smi shows in use, naming the
processes and the GPUs free now."""

from __future__ import annotations

import http.server
import os
import shlex
import sys
import threading
from pathlib import Path

import pytest
from tests.test_launch import accelerate_args, flag, run, split_env
from tests.test_launch_nodes import Health

from emoji_rl.io import nvidia_smi

ROOT = Path(__file__).resolve().parents[1]

# What nvidia-smi 570 prints for the two queries on an 8 x H100 box where vLLM holds GPUs 0-3
# (a judge on 0,1 and a policy server on 2,3) and GPU 5 is full of something another container runs.
GPUS_CSV = "\n".join(
    f"{i}, GPU-{i:08x}-aaaa-bbbb-cccc-0123456789ab, {used}, 81559"
    for i, used in enumerate([73411, 73411, 73411, 73411, 1, 30210, 1, 1])
)
APPS_CSV = "\n".join(
    f"GPU-{gpu:08x}-aaaa-bbbb-cccc-0123456789ab, {pid}, {name}, 73400"
    for gpu, pid, name in [
        (0, 4100, "VLLM::Worker_TP0"),
        (1, 4101, "VLLM::Worker_TP1"),
        (2, 4200, "python3"),
        (3, 4201, "python3"),
    ]
)


@pytest.fixture
def busy_box(tmp_path):
    """PATH with an nvidia-smi that answers the two queries as above."""
    (tmp_path / "gpus.csv").write_text(GPUS_CSV + "\n")
    (tmp_path / "apps.csv").write_text(APPS_CSV + "\n")
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --query-gpu=*) cat {tmp_path}/gpus.csv ;; --query-compute-apps=*) cat {tmp_path}/apps.csv ;;\n'
        f'  --list-gpus) for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 80GB HBM3"; done ;; esac\n'
    )
    fake.chmod(0o755)
    return f"{tmp_path}{os.pathsep}{os.environ['PATH']}"


def test_gpus_in_use_are_read_from_nvidia_smi():
    gpus, apps = nvidia_smi.parse_gpus(GPUS_CSV), nvidia_smi.parse_apps(APPS_CSV)
    busy = nvidia_smi.taken(gpus, apps, None)
    assert [gpu.index for gpu, _ in busy] == ["0", "1", "2", "3", "5"]
    assert [app.pid for app in busy[0][1]] == [4100] and busy[4][1] == []  # GPU 5: no process shown
    assert nvidia_smi.taken(gpus, apps, ["4", "6", "7"]) == []
    message = nvidia_smi.refusal("train_sft.sh", busy, ["4", "6", "7"])
    assert "GPU 0,1,2,3,5 already in use" in message
    assert "GPU 0: 73,411 of 81,559 MiB in use (pid 4100 VLLM::Worker_TP0: 73,400 MiB)" in message
    assert "GPU 5: 30,210 of 81,559 MiB in use (by processes nvidia-smi does not show)" in message
    assert message.endswith("or set TRAIN_GPUS to GPUs free now (4,6,7)")


@pytest.mark.parametrize(
    ("script", "env"),
    [
        ("train_sft.sh", {"GPUS": "8"}),  # every GPU
        ("train_sft.sh", {"GPUS": "8", "TRAIN_GPUS": "4,5"}),
        ("train_grpo.sh", {"GPUS": "8", "JUDGE_GPUS": "", "POLICY_GPUS": "", "TRAIN_GPUS": "2,3"}),
        ("eval_retrieval.sh", {"GPUS": "8", "JUDGE_GPUS": "0", "POLICY_GPUS": "", "TRAIN_GPUS": "1"}),
    ],
)
def test_a_trainer_refuses_gpus_a_server_holds_before_it_starts(busy_box, script, env):
    result = run(
        script, PATH=busy_box, PYTHON=sys.executable, PYTHONPATH=os.environ.get("PYTHONPATH", ""), **env
    )
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert f"{script}: GPU " in result.stderr and "already in use" in result.stderr
    assert "or set TRAIN_GPUS to GPUs free now (4,6,7)" in result.stderr
    # Under --dry-run nothing is asked: the command is printed as ever.
    assert run(script, "--dry-run", PATH=busy_box, **env).returncode == 0


def test_with_servers_tells_its_command_where_the_servers_listen(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    env = {
        "GPUS": "0", "JUDGE_HOST": "127.0.0.2", "JUDGE_PORT": str(port), "PYTHON": sys.executable,
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "SERVER_LOG_DIR": str(tmp_path), "WAIT_S": "5",
    }  # fmt: skip
    try:
        result = run("with_servers.sh", "judge", "--", "printf", "%s\\n", "stage", **env)
        refused = run("with_servers.sh", "judge", "--", "true", "--judge_url=http://127.0.0.1:8001", **env)
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["stage", "--judge_url", f"http://127.0.0.2:{port}"]
    assert refused.returncode == 2
    assert (
        f"--judge_url http://127.0.0.1:8001 is not where the server listens: this script starts or finds it at http://127.0.0.2:{port}"
        in refused.stderr
    )


def test_with_servers_points_the_grpo_stage_at_both_servers():
    env = {"GPUS": "8", "JUDGE_HOST": "10.0.0.1", "POLICY_PORT": "9002"}
    result = run(
        "with_servers.sh",
        "judge,policy",
        "--dry-run",
        "--",
        "launch/train_grpo.sh",
        "--max_steps",
        "2",
        **env,
    )
    assert result.returncode == 0, result.stderr
    [grpo] = [shlex.split(line) for line in result.stdout.splitlines() if "emoji_rl.cli" in line]
    args = accelerate_args(split_env(grpo)[1]).training_script_args
    assert (
        flag(args, "--judge_url") == "http://10.0.0.1:8001"
        and flag(args, "--vllm_url") == "http://127.0.0.1:9002"
    )
    assert args[-4:-2] == ["--max_steps", "2"] or args.index("--max_steps") < args.index("--judge_url")


def test_gpu_smoke_fails_a_server_it_did_not_start(tmp_path):
    # A judge already answers on JUDGE_PORT: the smoke test's own would die on the taken port while the
    # stranger answered /health for it.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "GPUS": "2", "JUDGE_PORT": str(server.server_address[1]), "VLLM": "false",
        "PYTHON": sys.executable, "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "SMOKE_DIR": str(tmp_path / "smoke"), "WAIT_S": "5",
    }  # fmt: skip
    try:
        result = run("gpu_smoke.sh", **env)
    finally:
        server.shutdown()
    assert result.returncode == 1
    summary = (tmp_path / "smoke" / "summary.txt").read_text()
    assert "judge-server   FAIL" in summary and "grpo           SKIP" in summary, summary
    assert f"a server already answers at http://127.0.0.1:{server.server_address[1]}" in result.stderr


def test_setup_gpu_compiles_for_this_boxs_gpus_with_ninja_on_the_path(tmp_path):
    # Point 3: flash-attn compiles for 80;90;100;120 unless told, and one file at a time without ninja
    # on the PATH (torch looks for it there only).
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\n[ "$1" = --query-gpu=compute_cap ] && printf "9.0\\n9.0\\n"\n')
    fake.chmod(0o755)
    path = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
    venv = {"PYTHON": ".venv/bin/python", "CUDA_HOME": "/usr/local/cuda"}
    result = run("setup_gpu.sh", "--dry-run", PATH=path, MAX_JOBS="6", **venv)
    assert result.returncode == 0, result.stderr
    ninja, build = (shlex.split(line) for line in result.stdout.splitlines())
    assert ninja[1:] == ["-m", "pip", "install", "--quiet", "ninja"]
    env, cmd = split_env(build)
    assert env["PATH"].split(os.pathsep)[0] == str(ROOT / ".venv" / "bin")
    assert (env["FLASH_ATTN_CUDA_ARCHS"], env["TORCH_CUDA_ARCH_LIST"], env["MAX_JOBS"]) == ("90", "9.0", "6")
    assert cmd[1:] == ["-m", "pip", "install", "--no-build-isolation", "-e", ".[gpu]"]
    mixed = run("setup_gpu.sh", "--dry-run", CUDA_ARCHS="8.0 8.6,9.0", **venv)
    env = split_env(shlex.split(mixed.stdout.splitlines()[1]))[0]
    assert (env["FLASH_ATTN_CUDA_ARCHS"], env["TORCH_CUDA_ARCH_LIST"]) == ("80;90", "8.0;8.6;9.0")
    assert int(env["MAX_JOBS"]) >= 1
    old = run("setup_gpu.sh", "--dry-run", CUDA_ARCHS="7.5", **venv)
    assert old.returncode == 2 and "flash-attn 2 runs on 8.0 (Ampere) and newer" in old.stderr
