"""Several nodes, and servers bound to one address, as the real launchers run them (issue 54).

docs/gpu/README.md's two-node and K = 2 commands run with --dry-run, and what they print is read by
the libraries' own code: accelerate's argument parser and its split of --num_processes among the
machines, torch's elastic agent's assignment of ranks over the nodes, and each stage's config
parser. Then the node settings the scripts refuse, a node that starts another number of processes
than the other (the real launchers, two nodes on this machine), and launch/with_servers.sh asking a
server bound to one address for /health there.
"""

from __future__ import annotations

import http.server
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
from tests.launching import free_port
from tests.test_launch import accelerate_args, dry_run, flag, make, parse_stage, run, split_env
from tests.test_two_nodes import descendants

ROOT = Path(__file__).resolve().parents[1]
GPU_DOC = ROOT / "docs" / "gpu" / "README.md"


def doc_commands(heading: str) -> list[list[str]]:
    """The commands of the ```bash blocks in docs/gpu/README.md's section `heading`, each as words (its
    continuation lines joined, comments dropped)."""
    section = GPU_DOC.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert blocks, f"no bash block under '## {heading}' in {GPU_DOC}"
    lines = "".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip() and not line.startswith("#")]


def dry_run_doc(words: list[str], **env: str) -> list[list[str]]:
    """A documented command run with --dry-run (make: ARGS=--dry-run), `env` added: what it prints,
    as argument lists."""
    settings = dict(env)
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        settings[name] = value
    if words[0] == "make":
        result = make(*words[1:], "ARGS=--dry-run", VLLM="vllm", **settings)
    elif words[0] == "launch/with_servers.sh":  # its --dry-run follows the servers it is given
        result = run("with_servers.sh", words[1], "--dry-run", *words[2:], **settings)
    else:
        script = words[0].removeprefix("launch/")
        result = run(script, "--dry-run", *words[1:], **settings)
    assert result.returncode == 0, (words, result.stderr)
    return [shlex.split(line) for line in result.stdout.splitlines() if line and not line.startswith("#")]


def local_processes(argv: list[str], monkeypatch) -> int:
    """How many processes torch's elastic agent starts on this node for a printed launcher command:
    accelerate's own reading of it (its config file, then `--num_processes` split among
    `--num_machines`), then torch.distributed.run's (its configuration of the agent)."""
    from accelerate.commands.launch import _validate_launch_command
    from accelerate.utils import _filter_args
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.run import config_from_args, get_args_parser

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # config_from_args sets it when unset
    # Node 0's launcher refuses a MASTER_PORT in use: this machine's ports are not the command's.
    monkeypatch.setattr("accelerate.utils.launch.is_port_in_use", lambda port: False)
    cmd = split_env(argv)[1]
    if cmd[1:3] == ["-m", "accelerate.commands.launch"]:
        # As accelerate's multi_gpu_launcher hands them to torch.distributed.run.
        args, _, _ = _validate_launch_command(accelerate_args(cmd))
        prepare_multi_gpu_env(args)
        script = [
            "--training_script",
            args.training_script,
            "--training_script_args",
            args.training_script_args,
        ]
        args = _filter_args(args, get_args_parser(), script)
    else:
        args = get_args_parser().parse_args(cmd[3:])
    config, _, _ = config_from_args(args)
    return config.nproc_per_node


def world_sizes(local: list[int]) -> list[int]:
    """The WORLD_SIZE torch's elastic agent gives each node's processes, from each node's count: its
    own rank assignment over a store the agents share (one thread per node here)."""
    from torch.distributed import HashStore
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    store, sizes = HashStore(), {}

    def node(rank: int) -> None:
        spec = types.SimpleNamespace(role="default", local_world_size=local[rank])
        workers = SimpleElasticAgent._assign_worker_ranks(None, store, rank, len(local), spec)
        sizes[rank] = {worker.world_size for worker in workers}

    threads = [threading.Thread(target=node, args=(rank,)) for rank in reversed(range(len(local)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return [size for rank in range(len(local)) for size in sizes[rank]]


def test_the_oracle_adds_up_unequal_nodes():
    # torch's agent sums the nodes' counts: the first day's 4 + 8, which 32 prompts do not divide.
    assert world_sizes([4, 8]) == [12, 12]


@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_the_documented_two_node_commands_run_as_many_processes_on_each_node_and_divide_the_batch(
    launcher, monkeypatch
):
    from emoji_rl.rl.rollout.collect import prompts_per_process
    from emoji_rl.sft.trl_config import accumulation_steps

    monkeypatch.chdir(ROOT)  # the commands name their config files from the repository root
    stages: dict[str, list[tuple[int, object]]] = {"grpo": [], "sft": []}
    for words in doc_commands("Two nodes"):
        # Two 8-GPU boxes, as the section says; the jobs over both nodes (not node 0's rl-prompts).
        [argv] = [a for a in dry_run_doc(words, GPUS="8", LAUNCHER=launcher) if "emoji_rl.cli" in a]
        cmd = split_env(argv)[1]
        module = cmd.index("emoji_rl.cli")
        stage, args = cmd[module + 1], cmd[module + 2 :]
        if stage in stages:
            stages[stage].append((local_processes(argv, monkeypatch), parse_stage(stage, args)))
    for stage, nodes in stages.items():
        counts = [count for count, _ in nodes]
        assert len(nodes) == 2 and counts[0] == counts[1], (stage, counts)
        [world] = set(world_sizes(counts))
        assert world == sum(counts)
        cfg = nodes[0][1]
        if stage == "grpo":
            assert (world, prompts_per_process(cfg.batch_size, world)) == (8, 4)
        else:
            assert world == 16 and accumulation_steps(cfg, world) >= 1


def test_the_documented_two_versions_behind_commands_size_the_server_and_the_trainer_alike(monkeypatch):
    monkeypatch.chdir(ROOT)
    commands = [
        argv for words in doc_commands("Which GPUs are busy when") for argv in dry_run_doc(words, GPUS="4")
    ]
    [policy] = [argv for argv in commands if "--enable-lora" in argv]
    [grpo] = [argv for argv in commands if "emoji_rl.cli" in argv]
    cmd = split_env(grpo)[1]
    cfg = parse_stage("grpo", cmd[cmd.index("emoji_rl.cli") + 2 :])
    assert cfg.max_off_policy_steps == 2 and cfg.vllm_adapter_keep == 3
    assert int(flag(policy, "--max-loras")) >= 3 and int(flag(policy, "--max-cpu-loras")) >= 3


# --- node settings -----------------------------------------------------------------------------------

NODE_1 = {"NNODES": "2", "NODE_RANK": "1", "JUDGE_GPUS": "", "POLICY_GPUS": "", "TRAIN_GPUS": "0,1,2,3"}


@pytest.mark.parametrize("script", ["train_grpo.sh", "train_sft.sh"])
def test_several_nodes_need_master_addr(script):
    result = run(script, "--dry-run", GPUS="8", **NODE_1)
    assert result.returncode == 2 and result.stdout == ""
    assert "NNODES=2 needs MASTER_ADDR: node 0's address on the network the nodes share" in result.stderr


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.1.1", "localhost", "::1"])
@pytest.mark.parametrize("script", ["train_grpo.sh", "train_sft.sh"])
def test_a_loopback_master_addr_is_refused_with_several_nodes_but_for_nodes_on_one_cpu_machine(
    script, address
):
    result = run(script, "--dry-run", GPUS="8", MASTER_ADDR=address, **NODE_1)
    assert result.returncode == 2 and result.stdout == ""
    assert (
        f"MASTER_ADDR={address} is a loopback address here, which the other nodes cannot reach"
        in result.stderr
    )
    # One node: it is the default. GPUS=0: the nodes of tests/test_two_nodes.py, on one machine.
    one_node = {**NODE_1, "NNODES": "1", "NODE_RANK": "0"}
    assert run(script, "--dry-run", GPUS="8", MASTER_ADDR=address, **one_node).returncode == 0
    cpu_nodes = {"GPUS": "0", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": address}
    [argv] = [shlex.split(run(script, "--dry-run", **cpu_nodes).stdout)]
    assert accelerate_args(split_env(argv)[1]).main_process_ip == address


@pytest.mark.slow
def test_nodes_that_start_unequal_numbers_of_processes_stop_before_any_model_loads(tmp_path):
    # Node 0 starts 1 process, node 1 starts 2: accelerate's launcher on each (GPUS=0: over gloo).
    env = {
        **os.environ, "GPUS": "0", "NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "CONFIG": "configs/cpu/grpo.yaml",
    }  # fmt: skip
    records = tmp_path / "rl_train.jsonl"
    records.write_text('{"target": "a cat on a mat"}\n')  # every input is there: the world is what fails
    script = ["bash", str(ROOT / "launch" / "train_grpo.sh"), "--output_dir", str(tmp_path / "run")]
    script += ["--train_data", str(records), "--init_adapter", "none"]
    out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    nodes = [
        subprocess.Popen(script, cwd=ROOT, env={**env, "NODE_RANK": str(rank), "NGPUS": str(rank + 1)}, **out)
        for rank in range(2)
    ]
    try:
        logs = [node.communicate(timeout=300)[0] for node in nodes]
    except subprocess.TimeoutExpired:
        for pid in {pid for node in nodes for pid in descendants(node.pid)}:
            os.kill(pid, signal.SIGKILL)
        pytest.fail("the nodes went on: no process refused the job")
    assert [node.returncode != 0 for node in nodes] == [True, True], logs
    for log in logs:
        assert "the nodes run unequal numbers of processes (node 0 runs 1, node 1 runs 2: 3 in all)" in log
        assert "runtime:" not in log  # before any model loaded
    assert not (tmp_path / "run" / "config.yaml").exists()


# --- a server bound to one address -------------------------------------------------------------------


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_with_servers_asks_for_health_where_the_server_is_bound(tmp_path):
    # A judge already up on 127.0.0.2 only, as JUDGE_HOST=127.0.0.2 binds it: 127.0.0.1 does not answer.
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "GPUS": "0", "JUDGE_HOST": "127.0.0.2", "JUDGE_PORT": str(server.server_address[1]),
        "PYTHON": sys.executable, "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "SERVER_LOG_DIR": str(tmp_path), "WAIT_S": "5",
    }  # fmt: skip
    try:
        result = run("with_servers.sh", "judge", "--", "true", **env)
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    assert (
        f"judge server already answers at http://127.0.0.2:{server.server_address[1]}: using it"
        in result.stderr
    )


@pytest.mark.parametrize(
    ("host", "url"),
    [("0.0.0.0", "http://127.0.0.1:8001"), ("10.0.0.1", "http://10.0.0.1:8001"), ("::", "http://[::1]:8001")],
)
def test_the_smoke_test_reaches_the_judge_where_it_is_bound(host, url):
    _, wait_judge, grpo, _ = dry_run("gpu_smoke.sh", GPUS="2", JUDGE_HOST=host)
    assert wait_judge[3] == url
    assert flag(accelerate_args(split_env(grpo)[1]).training_script_args, "--judge_url") == url
