"""The stand-in of an emoji-rl stage on the simulated box, run by each rank a launcher starts (or once,
for a stage started alone). What it checks is what the real stage needs before it could do its work:

- its config parses with the stage's own parser (an unknown flag fails as it would);
- every file and directory the config marks as an input exists (cli.py's `missing_inputs`: the
  stage's own check, which the stand-in replaces with the stage);
- the checks the real stage makes before any model loads: the step's prompts divide among the
  processes, a run directory holding a run needs --resume;
- each server it is told about answers at that URL and serves the name it will ask for (an openai
  judge at judge_url, the policy at vllm_url, sized for max_off_policy_steps + 1 adapter versions);
- the memory of its GPU: the gpu profile's trainer as docs/gpu/README.md's sizing table counts it
  (selftest/sizing.py's arithmetic), a stage with a model in-process its weights and CUDA's overhead.

Then the global main process writes what the next stage reads (an adapter, the data files, reports).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import threading
from dataclasses import dataclass
from pathlib import Path

from tests.rehearsal.box import Box, Reply, gb_to_mib

from emoji_rl import cli
from emoji_rl.config import parse_config
from emoji_rl.errors import UserError
from emoji_rl.io.run_lock import holds_a_run
from emoji_rl.selftest.sizing import OVERHEAD_GB, Plan

# docs/gpu/README.md, "Sizing": Qwen3.5-4B's bf16 weights, the LoRA r=32 with AdamW's state (counted),
# and a layer's activations a token (2,330 MB measured in fp32 for 3,778 tokens, halved for bf16).
WEIGHTS_GB, LORA_ADAM_GB = 7.8, 0.97
LAYER_TOKEN_BYTES = 2330e6 / 3778 / 2
TOKENS_PER_ROW = {"grpo": 472, "sft": 128}
"""A micro-batch row's tokens: bench-scale's 5-turn episodes (selftest/sizing.py's gpu_plans), and an SFT
chat (the sender's prompt, a message and its emoji: under 128 Qwen tokens; sizing's max_length bound
of 512 is 4 times the data's)."""
TRAINERS = ("sft", "grpo")
CLAUDE_STAGES = {"prompts": "source", "teacher": "teacher"}
"""Stages that call the Anthropic API when this field names Claude."""
MODEL_STAGES = ("eval-sft", "eval-retrieval", "rl-prompts", "reward-check", "selftest", "judge-check")
"""Stages that put a model (or judge-check's embedder) on their GPU beside no optimizer."""

_PARSE = threading.Lock()  # parse_config prints argparse's errors to sys.stderr: one at a time


@dataclass(frozen=True)
class Rank:
    rank: int
    world_size: int
    gpu: int | None


def claim_gb(stage: str, cfg: object) -> float:
    if stage in TRAINERS:
        plan = Plan(stage, cfg.per_device_train_batch_size, TOKENS_PER_ROW[stage], cfg.gradient_checkpointing)
        fixed = WEIGHTS_GB + LORA_ADAM_GB + OVERHEAD_GB
        return plan.need_gb(fixed, LAYER_TOKEN_BYTES, plan.rows, plan.checkpointing)
    return WEIGHTS_GB + OVERHEAD_GB if stage in MODEL_STAGES else 0.0


def parse(stage: str, args: list[str], cwd: Path) -> object:
    """The stage's Config from `args` as the stage parses them in `cwd` (config files and relative
    paths resolved there). Raises UserError, or SystemExit with argparse's message."""
    args = [str(cwd / a) if i and args[i - 1] == "--config" else a for i, a in enumerate(args)]
    args = cli.stage_argv(stage, args)
    module = importlib.import_module(cli.STAGES[stage][0])
    err = io.StringIO()
    with _PARSE, contextlib.redirect_stderr(err):
        try:
            return parse_config(cli.config_class(module, args), args, prog=f"emoji-rl {stage}")
        except SystemExit:
            raise UserError(err.getvalue().strip()) from None


def servers(cfg: object) -> list[tuple[str, str, str, str | None]]:
    """(role, URL, served name, the env var of its key) of each server `cfg` asks."""
    wanted = []
    if getattr(cfg, "judge", None) == "openai":
        wanted.append(("judge", cfg.judge_url, cfg.judge_model, getattr(cfg, "judge_api_key_env", None)))
    if getattr(cfg, "engine", None) == "vllm":
        wanted.append(("policy", cfg.vllm_url, cfg.vllm_served_name, getattr(cfg, "vllm_api_key_env", None)))
    return wanted


def run(
    box: Box, stage: str, args: list[str], env: dict, cwd: Path, pid: int, ranks: list[Rank], reply: Reply
) -> int:
    from tests.rehearsal.standins import SERVED, server_problem

    where = f"emoji-rl {stage}"
    if stage not in cli.STAGES:
        reply.err(f"emoji-rl: unknown stage {stage!r}")
        return 2
    try:
        cfg = parse(stage, args, cwd)
    except UserError as err:
        reply.err(f"{where}: error: {err}")
        return 2
    world = ranks[0].world_size
    mib = gb_to_mib(claim_gb(stage, cfg))
    gpus = [r.gpu for r in ranks if r.gpu is not None and mib]
    box.record(kind="stage", stage=stage, args=args, ranks=[r.rank for r in ranks], world=world, gpus=gpus,
               env={k: env[k] for k in ("CUDA_VISIBLE_DEVICES", "MAX_OFF_POLICY_STEPS") if k in env})  # fmt: skip
    if missing := [entry.split(" (", 1)[0] for entry in cli.missing_inputs(cfg, cwd)]:
        box.violate(f"{where} started without its inputs: {', '.join(missing)}")
        reply.err(f"{where}: rehearsal: no such input: {', '.join(missing)}")
        return 2
    try:  # what the real stage checks before any model loads
        if stage == "grpo":
            from emoji_rl.rl.rollout.collect import prompts_per_process

            prompts_per_process(cfg.batch_size, world)
            if holds_a_run(cwd / cfg.output_dir) and not cfg.resume:
                raise UserError(f"{cfg.output_dir} already holds a run: pass --resume true to continue it")
        if stage == "sft":
            from emoji_rl.sft.trl_config import accumulation_steps

            accumulation_steps(cfg, world)
    except UserError as err:
        reply.err(f"{where}: error: {err}")
        return 2
    if (
        stage in CLAUDE_STAGES
        and getattr(cfg, CLAUDE_STAGES[stage]).startswith("claude")
        and not env.get("ANTHROPIC_API_KEY")
    ):
        reply.err(
            f"{where}: error: {stage} calls the Anthropic API and needs ANTHROPIC_API_KEY, which is not set"
        )
        return 2
    # Servers are up before a stage starts (with_servers.sh waits for them; node 1's ranks meet node
    # 0's after its servers answer): a short wait only.
    for role, url, name, key_env in servers(cfg):
        if problem := server_problem(url, name, 2, env.get(key_env or "")):
            box.violate(f"{where} is not pointed at its {role} server: {problem}")
            return 1
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        versions = getattr(cfg, "max_off_policy_steps", 0) + 1
        if role == "policy" and port in SERVED and SERVED[port].max_loras < versions:
            box.violate(
                f"{where} samples with {versions} adapter versions, its server batches --max-loras {SERVED[port].max_loras}"
            )
            return 1
    if gpus:
        by_gpu: dict[int, int] = {}
        for gpu in gpus:
            by_gpu[gpu] = by_gpu.get(gpu, 0) + mib
        if short := box.claim(pid, where, by_gpu):
            reply.err(f"torch.OutOfMemoryError: CUDA out of memory: {short[0]}")
            return 1
    try:
        if any(r.rank == 0 for r in ranks):
            write_outputs(stage, cfg, cwd)
    finally:
        box.release(pid)
    reply.err(f"{where}: rehearsal stand-in: {len(ranks)} of {world} process(es) on GPUs {gpus or 'none'}")
    return 0


def jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def adapter(directory: Path, cfg: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": getattr(cfg, "lora_r", None) or 32}))
    (directory / "adapter_model.safetensors").write_bytes(b"")


def write_outputs(stage: str, cfg: object, cwd: Path) -> None:
    """What the stage leaves for the stages after it (its content a placeholder: no model ran)."""
    records = [{"id": f"r{i}", "target": f"message {i}", "text": f"message {i}"} for i in range(4)]
    chats = [{"id": f"c{i}", "messages": []} for i in range(4)]
    if stage == "prompts":
        jsonl(cwd / cfg.path, records)
    elif stage == "teacher":
        for split in ("sft_train", "sft_test"):
            jsonl(cwd / cfg.output_dir / f"{split}.jsonl", chats)
    elif stage == "rl-prompts":
        for split in ("rl_train", "rl_eval"):
            jsonl(cwd / cfg.output_dir / f"{split}.jsonl", records)
    elif stage in TRAINERS:
        run_dir = cwd / cfg.output_dir
        adapter(run_dir / "adapter", cfg)
        jsonl(run_dir / "metrics.jsonl", [{"step": 1}])
    elif stage == "experiment-report":
        (cwd / cfg.run_dir / "report.md").write_text("# rehearsal\n")
    else:  # the evaluations and checks: a report where they write one
        out = getattr(cfg, "output_dir", None)
        path = (
            cwd / out / "results.json" if out else cwd / cfg.output if getattr(cfg, "output", None) else None
        )
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}\n")
