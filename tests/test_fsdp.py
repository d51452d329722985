"""FSDP for real on a CPU: `accelerate launch --config_file configs/accelerate/fsdp.yaml` of the SFT and
GRPO stages over 2 processes (gloo) on a tiny random `Qwen3_5ForCausalLM`, the real class, through the
accelerate, PEFT and Trainer calls a GPU launch makes (`launching.fsdp_on_cpu`). Each decoder layer is
its own shard unit; each stage trains, saves an adapter vLLM's Qwen3.5 loads, and a run killed after
a checkpoint resumes into the run it would have been, optimizer state included.

Run as a script (the slow tests do, under `accelerate launch`), this file is `emoji-rl` on FSDP plus
records of what the ranks held, and a SIGKILL of every rank at the checkpoint of step
$EMOJI_RL_TEST_KILL_AT, after that step was logged and before the checkpoint is written.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from tests.launching import accelerate_launch, cli_args, fsdp_on_cpu, read_weights
from tests.rl.test_distributed import SETTINGS as GRPO_SETTINGS
from tests.rl.test_distributed import TARGETS, _jsonl
from tests.sft.test_distributed import SETTINGS as SFT_SETTINGS
from tests.vllm_lora import qwen3_5_lora_modules, unexpected_modules, vllm_source

pytestmark = pytest.mark.slow

KILL_AT = "EMOJI_RL_TEST_KILL_AT"
# A hang (ranks waiting on each other's collective) fails the test instead of stalling the suite.
TIMEOUT_S = 300


def _launch(args: list[str], kill_at: int | None = None):
    env = {KILL_AT: str(kill_at)} if kill_at is not None else {}
    return accelerate_launch(__file__, args, strategy="fsdp", timeout=TIMEOUT_S, env=env)


def _assert_sharded_per_decoder_layer(run: Path) -> None:
    """Both ranks' records: every decoder layer is an FSDP unit of its own, and each rank holds a
    part of each LoRA weight (a DTensor whose local shard is smaller than the whole)."""
    for rank in range(2):
        layout = json.loads((run / f"layout{rank}.json").read_text())
        assert layout["distributed"] == "FSDP", layout
        layers = [f"model.layers.{i}" for i in range(4)]
        assert all(any(unit.endswith(layer) for unit in layout["units"]) for layer in layers), layout["units"]
        assert layout["lora"] and all(local < whole for local, whole in layout["lora"].values()), layout


def _assert_vllm_loads(adapter: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = json.loads((adapter / "adapter_config.json").read_text())
    PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"]), adapter
    )
    vllm = vllm_source()
    if vllm is None:
        # Not a skip, as for tests/oracle: `make test` builds the contract venv this reads.
        pytest.fail(
            "vLLM's source was not found to check the adapter's module names: run `make setup-vllm-cpu`"
        )
    weights, _ = read_weights(adapter / "adapter_model.safetensors")
    assert unexpected_modules(list(weights), qwen3_5_lora_modules(vllm)) == []


def _train_logs(run: Path) -> dict[int, dict]:
    """step -> its training log line (not the end-of-training summary)."""
    return {row["step"]: row for row in _jsonl(run / "metrics.jsonl") if "train/loss" in row}


def test_sft_shards_each_layer_and_a_killed_run_resumes_into_the_same_run(tiny_qwen, tmp_path):
    from tests.sft.conftest import PAIRS, write_chats

    train = write_chats(tmp_path / "train.jsonl", PAIRS[:32])
    run = tmp_path / "run"
    settings = {
        **SFT_SETTINGS,
        "model": tiny_qwen,
        "train_data": train,
        "output_dir": run,
        "max_steps": 4,
        "learning_rate": 1e-2,
        "save_total_limit": None,
    }
    args = ["sft", *cli_args(settings)]
    killed = _launch(args, kill_at=4)
    assert killed.returncode != 0 and (run / "killed.safetensors").is_file(), killed.stderr[-4000:]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"]
    _assert_sharded_per_decoder_layer(run)
    before = _train_logs(run)
    assert sorted(before) == [1, 2, 3, 4]

    resumed = _launch([*args, "--resume", "true"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    after = _train_logs(run)
    # Steps 3 and 4 again, from checkpoint-2's adapter, optimizer moments and data position: the losses
    # and gradient norms of the killed run, and its weights after step 4.
    assert sorted(after) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("train/loss", "train/grad_norm", "train/learning_rate"):
            assert after[step][key] == pytest.approx(before[step][key], rel=1e-5), (step, key)
    final, _ = read_weights(run / "adapter" / "adapter_model.safetensors")
    at_kill, _ = read_weights(run / "killed.safetensors")
    assert final.keys() == {k.replace(".default", "") for k in at_kill}
    assert all(torch.allclose(final[k.replace(".default", "")], v, atol=1e-6) for k, v in at_kill.items())
    assert any(v.abs().max() > 0 for k, v in final.items() if "lora_B" in k), "nothing trained"
    _assert_vllm_loads(run / "adapter")


# Two turns: games end after different turns, so the ranks decode different numbers of times; a KL
# to the base model: the reference forward runs sharded too.
GRPO = {**GRPO_SETTINGS, "max_turns": 2, "learning_rate": 1e-2, "beta": 0.05}


def _comparable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "throughput/"))}


def test_grpo_shards_each_layer_decodes_apart_and_a_killed_run_resumes_into_the_same_run(tiny_qwen, tmp_path):
    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "target": t}) + "\n" for i, t in enumerate(TARGETS)))
    run = tmp_path / "run"
    settings = {
        **GRPO,
        "model": tiny_qwen,
        "train_data": data,
        "output_dir": run,
        "max_steps": 3,
        "save_steps": 2,
    }
    args = ["grpo", *cli_args(settings)]
    killed = _launch(args, kill_at=3)
    assert killed.returncode != 0 and (run / "killed.safetensors").is_file(), killed.stderr[-4000:]
    assert (run / "checkpoints" / "latest").read_text() == "step-000002"
    _assert_sharded_per_decoder_layer(run)
    # The ranks' rollouts decoded a different number of forwards (rows stopping at different steps,
    # games ending after different turns): each forward on sharded weights would be a collective.
    decoded = [_jsonl(run / f"decoded{rank}") for rank in range(2)]
    assert any(a["forwards"] != b["forwards"] for a, b in zip(*decoded, strict=True)), decoded
    before = {m["step"]: m for m in _jsonl(run / "metrics.jsonl")}
    assert sorted(before) == [1, 2, 3] and any(m["optim/skipped"] == 0 for m in before.values())

    resumed = _launch([*args, "--resume", "true"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    after = {m["step"]: m for m in _jsonl(run / "metrics.jsonl")}
    # Step 3 again from step 2's checkpoint: the same rollouts, loss and gradient norm, and, through
    # the optimizer's restored moments, the same weights and moments after the update.
    assert sorted(after) == [1, 2, 3]
    assert _comparable(after[3]) == pytest.approx(_comparable(before[3]), rel=1e-5)
    final, _ = read_weights(run / "adapter" / "adapter_model.safetensors")
    at_kill, _ = read_weights(run / "killed.safetensors")
    assert final.keys() == {k.replace(".default", "") for k in at_kill}
    assert all(torch.allclose(final[k.replace(".default", "")], v, atol=1e-6) for k, v in at_kill.items())
    saved = torch.load(run / "checkpoints" / "step-000003" / "trainer_state.pt", weights_only=False)
    moments = torch.load(run / "killed_optimizer.pt", weights_only=False)["state"]
    assert saved["optimizer"]["state"].keys() == moments.keys()
    for name, state in moments.items():
        for key in ("exp_avg", "exp_avg_sq"):
            whole = saved["optimizer"]["state"][name][key]
            assert whole.shape == state[key].shape and torch.allclose(whole, state[key], atol=1e-6), name
    _assert_vllm_loads(run / "adapter")


def test_the_wordle_curriculum_takes_one_decision_from_every_rank(tiny_qwen, tmp_path):
    data = tmp_path / "wordle.jsonl"
    answers = ["above", "crane", "speed", "light", "money", "party"]
    data.write_text("".join(json.dumps({"id": a, "answer": a}) + "\n" for a in answers))
    run = tmp_path / "run"
    # One game per prompt, 2 per rank per step; the next phase starts once 4 episodes are in the window
    # (threshold 0: any format compliance will do): after step 1, counting both ranks' episodes.
    settings = dict(
        game="wordle",
        model=tiny_qwen,
        train_data=data,
        output_dir=run,
        batch_size=2,  # over both ranks: one prompt each
        group_size=2,
        max_turns=1,
        max_new_tokens=8,
        lora_r=4,
        beta=0.0,
        curriculum_window=4,
        curriculum_threshold=0.0,
        max_steps=2,
        save_steps=1,
        gradient_checkpointing=True,  # as the Wordle configs train: checkpointed layers under FSDP2
    )
    done = _launch(["grpo", *cli_args(settings)])
    assert done.returncode == 0, done.stderr[-4000:]
    curricula = [_jsonl(run / f"curriculum{rank}") for rank in range(2)]
    assert curricula[0] == curricula[1], curricula
    phases = [m["game/curriculum_phase"] for m in _jsonl(run / "metrics.jsonl")]
    assert phases == [0.0, 1.0]
    saved = torch.load(run / "checkpoints" / "step-000001" / "trainer_state.pt", weights_only=False)
    assert saved["game"] == {"phase": 1, "recent": []} == curricula[0][0]


# --- the launched script -----------------------------------------------------------------------------


def _layout(model: torch.nn.Module, distributed: str) -> dict[str, object]:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    units = [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]
    lora = {
        name: (p.to_local().numel(), p.numel())
        for name, p in model.named_parameters()
        if "lora_" in name and isinstance(p, DTensor)
    }
    return {"distributed": distributed, "units": units, "lora": lora}


def _record_and_maybe_die(run: Path, rank: int, step: int, model, optimizer, distributed: str) -> None:
    """At every checkpoint, this rank's layout; at step $EMOJI_RL_TEST_KILL_AT, the whole adapter and
    optimizer state as they are (collectives: every rank calls this), then a SIGKILL of every rank."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    from emoji_rl.lm.distributed import adapter_state_dict
    from emoji_rl.rl.checkpoint import whole_optimizer_state

    (run / f"layout{rank}.json").write_text(json.dumps(_layout(model, distributed)))
    if os.environ.get(KILL_AT) != str(step):
        return
    adapter = adapter_state_dict(model)
    moments = whole_optimizer_state(model, optimizer)
    if rank == 0:
        save_file({k: v.contiguous() for k, v in adapter.items()}, str(run / "killed.safetensors"))
        torch.save(moments, run / "killed_optimizer.pt")
    dist.barrier()
    os.kill(os.getpid(), signal.SIGKILL)


def _sft() -> None:
    from transformers import Trainer

    save_checkpoint = Trainer._save_checkpoint

    def record_then_save(self, model, trial):
        run = Path(self.args.output_dir)
        distributed = self.accelerator.distributed_type.value
        _record_and_maybe_die(
            run, self.args.process_index, self.state.global_step, self.model, self.optimizer, distributed
        )
        save_checkpoint(self, model, trial)

    Trainer._save_checkpoint = record_then_save


def _grpo(run: Path) -> None:
    import torch.distributed as dist

    from emoji_rl.decode import generate
    from emoji_rl.rl.rollout import schedule
    from emoji_rl.rl.trainer import Trainer

    decode, collect, save = generate.decode, schedule.collect, Trainer.save
    forwards = [0]

    def counted_decode(*args, **kwargs):
        rows = decode(*args, **kwargs)
        forwards[0] += max(len(tokens) for tokens, _, _ in rows)  # one forward per step of the longest row
        return rows

    async def collect_and_record(stream, *args, **kwargs):
        forwards[0] = 0
        rollouts = await collect(stream, *args, **kwargs)
        with open(run / f"decoded{dist.get_rank()}", "a") as f:
            f.write(json.dumps({"step": stream.state.step + 1, "forwards": forwards[0]}) + "\n")
        return rollouts

    def record_then_save(trainer, run_dir, state, game, behaviour):
        rank = trainer.accelerator.process_index
        if game is not None:
            with open(run / f"curriculum{rank}", "a") as f:
                f.write(json.dumps(game.state_dict()) + "\n")
        distributed = trainer.accelerator.distributed_type.value
        _record_and_maybe_die(run_dir, rank, state.step, trainer.model, trainer.optimizer, distributed)
        save(trainer, run_dir, state, game, behaviour)

    generate.decode, schedule.collect, Trainer.save = counted_decode, collect_and_record, record_then_save


if __name__ == "__main__":
    import sys

    from emoji_rl import cli

    fsdp_on_cpu()
    if sys.argv[1] == "sft":
        _sft()
    else:
        _grpo(Path(sys.argv[sys.argv.index("--output_dir") + 1]))
    raise SystemExit(cli.main())
