"""The stand-ins: what runs where a GPU program would start on the simulated box. Each records what it
was given, checks what the real program needs of it, and does what the next command reads.

- `vllm serve`: claims its --gpu-memory-utilization share of each of its GPUs (vLLM refuses to start
  on less free memory), binds its host and port (a taken port ends it, as vLLM's bind does) and serves
  the fake vLLM server there under its served names, until it is killed.
- a launcher (`accelerate launch`, `torchrun`): accelerate's and torch's own parsers read its
  arguments, the nodes meet over a real TCPStore at its rendezvous address and get their ranks from
  torch's elastic agent, and each rank runs the stage stand-in on its GPU (stages.py).
- `pip install`: of vllm or this project, the programs they install; of the gpu extra, the checks
  that flash-attn and causal-conv1d compile in minutes, not hours (ninja, the box's architecture only,
  MAX_JOBS, nvcc).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import httpx
from tests.fakes.fake_lm import FakeLM
from tests.fakes.vllm_server import FakeVLLMServer
from tests.rehearsal import shims, stages
from tests.rehearsal.box import CARD_MIB, COMPUTE_CAP, Box, Reply

CUDA_BUILDS = ("flash-attn", "causal-conv1d")
FLASH_ATTN_ARCHS = {"80", "90", "100", "120"}
"""What flash-attn 2.8.3's setup.py compiles for (FLASH_ATTN_CUDA_ARCHS; all four by default)."""
RENDEZVOUS_S = 30


@dataclass
class Served:
    """A vLLM stand-in serving: what the stages that reach it check it for."""

    node: int
    pid: int
    names: tuple[str, ...]
    max_loras: int
    server: FakeVLLMServer


SERVED: dict[int, Served] = {}
"""Every stand-in server of this machine, by port (the two nodes share the machine's ports)."""
_LM: list[FakeLM] = []


def handle(box: Box, request: dict, reply: Reply, conn) -> int | None:
    kind, argv, env, cwd = request["kind"], request["argv"], request["env"], Path(request["cwd"])
    if kind == "nvidia-smi":
        text, code = box.nvidia_smi(argv[1:])
        reply.out(text) if code == 0 else reply.err(text)
        return code
    if kind == "nvcc":
        if "--version" in argv or "-V" in argv:
            reply.out("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.8, V12.8.93")
        box.record(kind="nvcc", argv=argv)
        return 0
    if kind == "ninja":
        return 0
    if kind == "venv":
        shims.make_venv(cwd / argv[-1])
        return 0
    if kind == "pip":
        return pip(box, argv, env, cwd, reply)
    if kind == "vllm":
        return serve(box, argv, env, request["pid"], reply, conn)
    if kind == "bench":
        return bench(box, argv, env, reply)
    if kind == "launcher":
        return launcher(box, argv, env, cwd, request["pid"], reply)
    if kind == "stage":
        visible = env.get("CUDA_VISIBLE_DEVICES")
        gpus = [int(g) for g in visible.split(",") if g] if visible is not None else [0]
        rank = stages.Rank(0, 1, gpus[0] if gpus else None)
        return stages.run(box, argv[1], argv[2:], env, cwd, request["pid"], [rank], reply)
    reply.err(f"rehearsal: no stand-in for {kind}")
    return 1


# --- pip -------------------------------------------------------------------------------------------------

WITH_VALUE = {"-c", "--constraint", "-r", "--requirement", "-e", "--editable", "-i", "--index-url", "-f"}


def pip(box: Box, argv: list[str], env: dict, cwd: Path, reply: Reply) -> int:
    venv = (cwd / argv[0]).parent.parent
    args = argv[1:]
    box.record(kind="pip", venv=str(venv), argv=args, env=_build_env(env))
    if not args or args[0] != "install":
        return 0
    requirements, i = [], 1
    while i < len(args):
        if args[i] in WITH_VALUE:
            if args[i] in ("-e", "--editable"):
                requirements.append(args[i + 1])
            i += 2
        else:
            if not args[i].startswith("-"):
                requirements.append(args[i])
            i += 1
    for requirement in requirements:
        shims.installed(venv, requirement)
    builds = [r for r in requirements if r.split("[")[0].split("=")[0] in CUDA_BUILDS or "gpu" in _extras(r)]
    if builds:
        for problem in cuda_build_problems(venv, args, env):
            box.violate(f"pip install {' '.join(builds)}: {problem}")
            reply.err(f"rehearsal: {problem}")
    return 0


def _extras(requirement: str) -> set[str]:
    return set(requirement.split("[", 1)[1].rstrip("]").split(",")) if "[" in requirement else set()


def _build_env(env: dict) -> dict:
    names = ("MAX_JOBS", "NVCC_THREADS", "FLASH_ATTN_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME")
    return {name: env[name] for name in names if name in env}


def cuda_build_problems(venv: Path, args: list[str], env: dict) -> list[str]:
    """Why compiling flash-attn and causal-conv1d here would fail or take hours (flash-attn 2.8.3's
    setup.py: 80 .cu files, for every architecture of FLASH_ATTN_CUDA_ARCHS)."""
    import shutil

    problems = []
    if "--no-build-isolation" not in args:
        problems.append("without --no-build-isolation the builds cannot import the venv's torch")
    if shutil.which("ninja", path=env.get("PATH")) is None:
        # torch.utils.cpp_extension.is_ninja_available runs `ninja --version` from the PATH
        where = f" ({venv.name}/bin holds one, not on the PATH)" if (venv / "bin" / "ninja").exists() else ""
        problems.append(
            f"no ninja on the PATH{where}: torch's BuildExtension compiles the .cu files one at a time"
        )
    if not env.get("MAX_JOBS"):
        problems.append("MAX_JOBS unset: ninja runs a job per core, each nvcc several GB")
    box_arch = COMPUTE_CAP.replace(".", "")
    archs = set(filter(None, env.get("FLASH_ATTN_CUDA_ARCHS", "").split(";")))
    if archs != {box_arch}:
        problems.append(
            f"FLASH_ATTN_CUDA_ARCHS={env.get('FLASH_ATTN_CUDA_ARCHS')}: this box's GPUs are compute capability "
            f"{COMPUTE_CAP} ({box_arch}); unset, flash-attn compiles for {';'.join(sorted(FLASH_ATTN_ARCHS))}"
        )
    if env.get("TORCH_CUDA_ARCH_LIST") != COMPUTE_CAP:
        problems.append(
            f"TORCH_CUDA_ARCH_LIST={env.get('TORCH_CUDA_ARCH_LIST')}, not this box's {COMPUTE_CAP}"
        )
    if shutil.which("nvcc", path=env.get("PATH")) is None and not env.get("CUDA_HOME"):
        problems.append("no nvcc on PATH and no CUDA_HOME")
    return problems


# --- vllm serve --------------------------------------------------------------------------------------------


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm", add_help=False)
    parser.add_argument("command")
    parser.add_argument("model")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-loras", type=int, default=1)
    return parser


def serve(box: Box, argv: list[str], env: dict, pid: int, reply: Reply, conn) -> int | None:
    args, _ = serve_parser().parse_known_args(argv[1:])
    names = tuple(args.served_model_name or [args.model])
    visible = [int(g) for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    box.record(kind="vllm", argv=argv, gpus=visible, host=args.host, port=args.port, names=names)
    workers = args.tensor_parallel_size * args.data_parallel_size
    if len(visible) != workers:
        box.violate(f"vllm serve on CUDA_VISIBLE_DEVICES={visible}: TP x DP = {workers} workers")
        return 1
    try:
        if not _LM:
            from tests.conftest import _word_level_tokenizer

            _LM.append(FakeLM(_word_level_tokenizer(eos=True)))
        server = FakeVLLMServer(
            _LM[0], served_model_names=names, api_key=env.get("VLLM_API_KEY"), host=args.host, port=args.port
        ).start()
    except OSError as err:  # vLLM binds its port before it loads anything
        box.violate(f"vllm serve {args.model} could not bind {args.host}:{args.port}: {err}")
        reply.err(f"OSError: {err}")
        return 1
    share = round(args.gpu_memory_utilization * CARD_MIB)
    if short := box.claim(pid, f"vllm serve {names[0]}", dict.fromkeys(visible, share)):
        server.stop()
        reply.err(
            f"ValueError: Free memory on device on startup is less than desired GPU memory utilization: {short[0]}"
        )
        return 1
    SERVED[args.port] = Served(box.node, pid, names, args.max_loras, server)
    reply.err(f"INFO: vllm stand-in serving {', '.join(names)} on {args.host}:{args.port}, GPUs {visible}")
    try:
        while conn.rfile.read(1):  # until the process is killed: its connection closes
            pass
    finally:
        SERVED.pop(args.port, None)
        server.stop()
        box.release(pid)
    return None


def server_problem(url: str, name: str, wait_s: float, auth: str | None = None) -> str | None:
    """Why a stage told `url` would not reach a server serving `name` there (waiting up to `wait_s`
    for it to come up, as the stages wait), or None."""
    deadline = time.monotonic() + wait_s
    headers = {"Authorization": f"Bearer {auth}"} if auth else {}
    while True:
        # Both requests inside the wait: a node's ranks ask at once, and one was refused between its
        # /health and its /v1/models (the stages' own clients retry as well).
        try:
            httpx.get(url.rstrip("/") + "/health", timeout=5)
            models = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=5).json()
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                up = ", ".join(f"{', '.join(s.names)} on port {port}" for port, s in sorted(SERVED.items()))
                return f"{url} does not answer (servers up: {up or 'none'})"
            time.sleep(0.2)
    served = [card["id"] for card in models.get("data", [])]
    return None if name in served else f"{url} serves {served}, not {name!r}"


def bench(box: Box, argv: list[str], env: dict, reply: Reply) -> int:
    """gpu_smoke.sh's GPU measurements of the policy server: a client of it, reaching it is what is
    checked here; the figures need a GPU."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--url")
    parser.add_argument("--model")
    parser.add_argument("--api_key_env")
    args, _ = parser.parse_known_args(argv[3:])
    box.record(kind="bench", argv=argv)
    if problem := server_problem(args.url, args.model, 5, env.get(args.api_key_env or "")):
        box.violate(f"{argv[2]}: {problem}")
        return 1
    first = "benchmark" if argv[2].endswith("sampling") else "prefix cache,"
    reply.out(f"{first} (rehearsal stand-in: no GPU, no figures)")
    return 0


# --- launchers ---------------------------------------------------------------------------------------------


def launcher(box: Box, argv: list[str], env: dict, cwd: Path, pid: int, reply: Reply) -> int:
    """A launcher's processes on this node, their ranks as torch's elastic agent assigns them."""
    module = argv[2]
    if module == "accelerate.commands.launch":
        from accelerate.commands.launch import launch_command_parser

        args = launch_command_parser().parse_args(argv[3:])
        nnodes, node_rank = args.num_machines or 1, args.machine_rank or 0
        local = args.num_processes // nnodes  # accelerate's prepare_multi_gpu_env
        declared, how = args.num_processes, f"accelerate --num_processes {args.num_processes}"
        address, port = args.main_process_ip, args.main_process_port
    else:
        from torch.distributed.run import get_args_parser

        args = get_args_parser().parse_args(argv[3:])
        nnodes, node_rank, local = int(args.nnodes), args.node_rank, int(args.nproc_per_node)
        declared, how = nnodes * local, f"torchrun --nnodes {nnodes} --nproc_per_node {local}"
        address, port = args.master_addr, args.master_port
    script = args.training_script_args
    if not (args.module and args.training_script == "emoji_rl.cli"):
        box.violate(f"{module} starts {args.training_script}, not emoji_rl.cli")
        return 1
    store, workers = rendezvous(address, int(port), nnodes, node_rank, local) if nnodes > 1 else (None, None)
    if workers is None and nnodes > 1:
        box.violate(f"{how}: the nodes never met at {address}:{port} within {RENDEZVOUS_S} s")
        return 1
    world = workers[0].world_size if workers else local
    if world != declared:
        box.violate(
            f"the nodes disagree on the world size: this node's launcher was told the job has {declared} "
            f"processes ({how}), torch's agent made {world} of the nodes' {local} here and the others'"
        )
        return 1
    visible = env.get("CUDA_VISIBLE_DEVICES")
    gpus = [int(g) for g in visible.split(",") if g] if visible is not None else list(range(box.gpus))
    ids = [worker.global_rank for worker in workers] if workers else list(range(local))
    if local > len(gpus):
        box.violate(f"{how} starts {local} processes on {len(gpus)} GPUs (CUDA_VISIBLE_DEVICES={visible})")
        return 1
    ranks = [stages.Rank(rank, world, gpus[i]) for i, rank in enumerate(ids)]
    try:
        return stages.run(box, script[0], script[1:], env, cwd, pid, ranks, reply)
    finally:
        if store is not None:
            finish_together(store, node_rank, nnodes)


def rendezvous(address: str, port: int, nnodes: int, node_rank: int, local: int):
    """(the store, this node's workers as torch's elastic agent assigns their ranks), over a TCPStore at
    `address` that node 0 holds (as a launcher's rendezvous does); (None, None) when the nodes do not
    all come."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    try:
        store = TCPStore(
            address,
            port,
            is_master=node_rank == 0,
            timeout=timedelta(seconds=RENDEZVOUS_S),
            wait_for_workers=False,
        )
        spec = SimpleNamespace(role="default", local_world_size=local)
        workers = SimpleElasticAgent._assign_worker_ranks(None, store, node_rank, nnodes, spec)
        node_0_waits(store, "rehearsal/done", node_rank, nnodes)  # until every node has read its ranks
    except (RuntimeError, OSError, TimeoutError):
        return None, None
    return store, workers


def finish_together(store, node_rank: int, nnodes: int) -> None:
    """Node 0's processes end only once every node's have: a real job's last collective holds them, and
    so node 0's servers (with_servers.sh stops them when its trainer ends) outlive node 1's use of them.
    Node 0 holds the store, so it is the one that waits."""
    with contextlib.suppress(RuntimeError, OSError, TimeoutError):
        node_0_waits(store, "rehearsal/finished", node_rank, nnodes)


def node_0_waits(store, key: str, node_rank: int, nnodes: int) -> None:
    """This node counts itself at `key`; node 0, which holds the store, then waits (up to RENDEZVOUS_S)
    until every node has."""
    store.add(key, 1)
    deadline = time.monotonic() + RENDEZVOUS_S
    while node_rank == 0 and store.add(key, 0) < nnodes and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_servers() -> None:
    """End every stand-in server still up (its process killed with its launcher, say), so that the
    next rehearsal finds the docs' ports free."""
    for port, served in list(SERVED.items()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(served.pid, signal.SIGKILL)
        served.server.stop()
        SERVED.pop(port, None)
