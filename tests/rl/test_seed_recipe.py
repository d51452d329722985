"""The original's recipe beside ours (docs/SEED_RECIPE.md): its switches reach the gradient as rl/grpo.py
says, whatever the micro-batch size (a tiny random Llama with a LoRA adapter); the seed configs hold
the original's values and differ from ours only where the docs' table says; the recipe runs on the cpu
profile's models for a few steps."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from tests.floats import F64, float64
from tests.tiny import saved, tiny_llama

from emoji_rl.config import parse_config
from emoji_rl.errors import UserError
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import models
from emoji_rl.rl.batch import Batch, token_logprobs
from emoji_rl.rl.policy import build_policy
from emoji_rl.rl.train_config import config_for, grpo_config
from emoji_rl.rl.update import UpdateSettings, update

ROOT = Path(__file__).resolve().parents[2]
SEED_DOC = ROOT / "docs" / "SEED_RECIPE.md"
# Three episodes of 5, 3 and 1 sender tokens (9 in all), with advantages +1, -0.5, -0.5.
MASK = torch.tensor(
    [[0, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0]],
    dtype=torch.bool,
)
ADVANTAGES = torch.tensor([1.0, -0.5, -0.5])
TOKENS = int(MASK.sum())


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    spec = saved(tiny_llama(), tmp_path_factory.mktemp("tiny") / "base")
    torch.manual_seed(0)
    policy = build_policy(spec, models.pick_runtime("cpu"), None, "base", lora_r=4, lora_alpha=8)
    # A fresh adapter leaves the base unchanged (LoRA B = 0): move it, so that the policy and its
    # reference (the base) differ and the KL is not 0.
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    return float64(policy)  # micro-batches against the whole batch: two paths (tests/floats.py)


@pytest.fixture(scope="module")
def accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


@pytest.fixture(scope="module")
def batch(policy):
    ids = torch.randint(0, 64, (3, 8), generator=torch.Generator().manual_seed(1))
    attention = (torch.arange(8) < torch.tensor([[8], [5], [3]])).long()
    unscored = Batch(ids, attention, MASK, torch.zeros(3, 7), ADVANTAGES, [])
    # The sampler's log-probs, as the in-process sampler reports them: the policy's own.
    with torch.no_grad():
        sampler_logp = token_logprobs(policy, unscored, 1.0)
    return Batch(ids, attention, MASK, sampler_logp, ADVANTAGES, [])


def gradient(policy, accelerator, batch, **settings):
    """The step's gradient (unclipped unless `max_grad_norm` says) and metrics of one `update`."""
    cfg = grpo_config(**{"max_grad_norm": 0.0, **settings})
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.0)
    metrics = update(cfg.update_settings(), accelerator, policy, optimizer, batch)
    return torch.cat([p.grad.flatten() for p in trainable]), metrics


@pytest.mark.float_paths
def test_a_summed_loss_counts_every_token_once_in_any_micro_batches(policy, accelerator, batch):
    one, one_metrics = gradient(
        policy, accelerator, batch, loss_type="sum", beta=0.0, per_device_train_batch_size=1
    )
    whole, whole_metrics = gradient(
        policy, accelerator, batch, loss_type="sum", beta=0.0, per_device_train_batch_size=3
    )
    mean, mean_metrics = gradient(
        policy, accelerator, batch, loss_type="dapo", beta=0.0, per_device_train_batch_size=2
    )
    assert one.abs().sum() > 0
    # Micro-batches change only the summation order; a token counted twice or not at all moves a
    # gradient by a whole token's share, orders of magnitude more.
    torch.testing.assert_close(one, whole, **F64)
    torch.testing.assert_close(whole, TOKENS * mean, **F64)
    # At ratio 1 each token's loss is -A: summed, -(5 x 1 + 3 x -0.5 + 1 x -0.5) = -3; averaged, -3 / 9.
    assert one_metrics["optim/loss"] == pytest.approx(-3.0) == whole_metrics["optim/loss"]
    assert mean_metrics["optim/loss"] == pytest.approx(-3.0 / TOKENS)


@pytest.mark.float_paths
def test_kl_in_the_reward_takes_its_baseline_over_the_whole_step(policy, accelerator, batch):
    settings = dict(loss_type="dapo", beta=0.5, kl_in="reward", reference="base")
    one, one_metrics = gradient(policy, accelerator, batch, per_device_train_batch_size=1, **settings)
    whole, whole_metrics = gradient(policy, accelerator, batch, per_device_train_batch_size=3, **settings)
    without, _ = gradient(
        policy, accelerator, batch, per_device_train_batch_size=3, loss_type="dapo", beta=0.0
    )
    # A baseline taken per micro-batch would change the gradient with the micro-batch size.
    torch.testing.assert_close(one, whole, **F64)
    assert not torch.allclose(whole, without, atol=1e-4)
    # The reported KL is the k1 mean over the 9 sender tokens: sampler minus base log-probs.
    with torch.no_grad(), policy.disable_adapter():
        base = token_logprobs(policy, batch, 1.0)
    k1 = ((batch.sampler_logp_D_T - base)[MASK]).mean().item()
    assert abs(k1) > 1e-3
    assert one_metrics["optim/kl"] == pytest.approx(k1, rel=F64["rtol"]) == whole_metrics["optim/kl"]
    # Around its mean the penalty adds nothing to the loss's value at ratio 1: it moves the gradient only.
    assert whole_metrics["optim/loss"] == pytest.approx(-3.0 / TOKENS, abs=1e-6)


def test_max_grad_norm_0_measures_the_gradient_and_clips_nothing(policy, accelerator, batch):
    free, free_metrics = gradient(policy, accelerator, batch, beta=0.0, max_grad_norm=0.0)
    clipped, clipped_metrics = gradient(policy, accelerator, batch, beta=0.0, max_grad_norm=1e-3)
    assert free.norm().item() == pytest.approx(free_metrics["optim/grad_norm"], rel=1e-4)
    assert free.norm().item() > 1e-2
    assert clipped.norm().item() == pytest.approx(1e-3, rel=1e-3)
    assert clipped_metrics["optim/grad_norm"] == pytest.approx(free_metrics["optim/grad_norm"], rel=1e-4)


def test_clip_range_follows_trl():
    assert grpo_config().clip_range == (0.2, 0.2)  # epsilon_high unset: epsilon
    assert grpo_config(epsilon=0.1, epsilon_high=0.28).clip_range == (0.1, 0.28)


def test_update_settings_are_the_stages():
    cfg = grpo_config(
        loss_type="dr_grpo",
        epsilon_high=0.28,
        beta=0.05,
        kl_in="reward",
        init_adapter="runs/sft/adapter",
        temperature=0.8,
        per_device_train_batch_size=4,
        max_new_tokens=32,
        max_turns=3,
        max_grad_norm=0.0,
        gradient_checkpointing=True,
    )
    assert cfg.update_settings(importance_weights=True) == UpdateSettings(
        loss_type="dr_grpo",
        clip_range=(0.2, 0.28),
        beta=0.05,
        kl_in="reward",
        reference="init",
        temperature=0.8,
        micro_batch=4,
        max_tokens=96,  # dr_grpo's normalizer: every turn's budget
        max_grad_norm=0.0,
        gradient_checkpointing=True,
        importance_weights=True,
    )
    # a fresh adapter's reference is the base model (the config's own rule); no vLLM: no importance weights
    assert grpo_config(beta=0.01).update_settings().reference == "base"
    assert not grpo_config().update_settings().importance_weights


def test_a_negative_max_grad_norm_is_refused():
    with pytest.raises(UserError, match=r"max_grad_norm=-1\.0 must be >= 0"):
        parse_config(config_for([]), ["--max_grad_norm", "-1"], prog="emoji-rl grpo")


# --- the configs and the docs' table -------------------------------------------------------------------


def resolved(path: Path) -> dict:
    argv = ["--config", str(path)]
    return vars(parse_config(config_for(argv), argv, prog="emoji-rl grpo"))


def table_rows() -> dict[str, str]:
    """docs/SEED_RECIPE.md's table of differences, the one whose last column is `config field`: each
    field named in that column (as `field: ours → the original's`) -> its row."""
    rows: dict[str, str] = {}
    in_table = False
    for line in SEED_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            in_table = False
        elif cells[-1] == "config field":
            in_table = True
        elif in_table:
            for name in re.findall(r"`(\w+):", cells[-1]):
                rows[name] = line
    return rows


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_the_seed_config_sets_the_originals_switches(profile):
    seed = resolved(ROOT / "configs" / profile / "grpo.seed.yaml")
    assert seed["scale_rewards"] == "none" and seed["loss_type"] == "sum"
    assert seed["beta"] == 0.01 and seed["kl_in"] == "reward" and seed["reference"] == "init"
    assert seed["temperature"] == 0.8
    assert (seed["epsilon"], seed["epsilon_high"]) == (0.2, None)  # tinker's ratio clip: [0.8, 1.2]
    assert (seed["adam_beta1"], seed["adam_beta2"], seed["weight_decay"]) == (0.9, 0.95, 0.0)
    assert seed["max_grad_norm"] == 0 and seed["repetition_penalty"] == 0
    assert not seed["dynamic_sampling"]


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_every_difference_from_our_config_is_in_the_docs_table(profile):
    ours = resolved(ROOT / "configs" / profile / "grpo.yaml")
    seed = resolved(ROOT / "configs" / profile / "grpo.seed.yaml")
    differ = {key for key in ours if ours[key] != seed[key]} - {"output_dir", "save_steps"}
    rows = table_rows()
    assert differ <= set(rows), f"not in {SEED_DOC.name}'s table: {sorted(differ - set(rows))}"
    # The same models, judge, data and scale: the recipe changes, the profile does not.
    same = (
        "model",
        "init_adapter",
        "judge",
        "judge_view",
        "judge_temperature",
        "batch_size",
        "group_size",
        "max_turns",
        "learning_rate",
    )
    assert all(ours[key] == seed[key] for key in same)


def test_every_field_the_table_names_is_a_config_field():
    fields = set(vars(grpo_config()))
    named = set(table_rows())
    assert named, f"{SEED_DOC.name} holds no table naming config fields"
    assert named <= fields, f"not fields of the grpo Config: {sorted(named - fields)}"


def test_the_gpu_seed_recipe_launches_through_train_grpo(monkeypatch):
    from tests.test_launch import accelerate_args, dry_run, parse_stage, split_env

    monkeypatch.chdir(ROOT)
    [argv] = dry_run("train_grpo.sh", GPUS="8", CONFIG="configs/gpu/grpo.seed.yaml")
    stage = accelerate_args(split_env(argv)[1]).training_script_args
    assert stage[:3] == ["grpo", "--config", "configs/gpu/grpo.seed.yaml"]
    cfg = parse_stage("grpo", stage[1:])
    assert (cfg.kl_in, cfg.loss_type, cfg.max_steps) == ("reward", "sum", 75)


# --- the recipe on the cpu profile ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_seed_recipe_trains_on_the_cpu_profile(tmp_path, capsys):
    from emoji_rl import cli

    data = tmp_path / "rl.jsonl"
    targets = ["let's get pizza tonight", "I missed the bus again"]
    data.write_text("".join(json.dumps({"id": f"t{i}", "target": t}) + "\n" for i, t in enumerate(targets)))
    out = tmp_path / "run"
    # The cpu seed config as it is, made small: a fresh adapter (no SFT run here; its reference is then
    # the base), the lexicon judge, one turn, 2 steps of one prompt x 4 rollouts.
    args = {
        "init_adapter": "none",
        "train_data": data,
        "output_dir": out,
        "judge": "lexicon",
        "max_steps": 2,
        "batch_size": 1,
        "max_turns": 1,
        "max_emoji": 4,
        "max_new_tokens": 32,
        "lora_r": 4,
        "learning_rate": 1e-3,
        "save_steps": 2,
    }
    argv = ["grpo", "--config", str(ROOT / "configs" / "cpu" / "grpo.seed.yaml")]
    argv += [item for key, value in args.items() for item in (f"--{key}", str(value))]
    # One thread: on a loaded 2-core machine two took 5 min for this run, one 43 s (docs/DESIGN.md §11).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = cli.main(argv)
    finally:
        torch.set_num_threads(threads)
    assert code == 0, capsys.readouterr().err
    saved_cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved_cfg["kl_in"], saved_cfg["loss_type"], saved_cfg["scale_rewards"]) == (
        "reward",
        "sum",
        "none",
    )
    assert saved_cfg["temperature"] == 0.8 and saved_cfg["repetition_penalty"] == 0
    first, second = read_metrics(out)
    assert first["optim/skipped"] == second["optim/skipped"] == 0, "a step did not update"
    assert all(
        math.isfinite(m["optim/loss"]) and math.isfinite(m["optim/grad_norm"]) for m in (first, second)
    )
    # Step 1 samples from a fresh adapter, which is the base (the reference): no KL yet; after one
    # update the policy has moved away from it.
    assert abs(first["optim/kl"]) < 1e-4 < abs(second["optim/kl"])
    # Adam (0.9, 0.95) without weight decay, as the checkpoint's optimizer holds it.
    state = torch.load(out / "checkpoints" / "step-000002" / "trainer_state.pt", weights_only=False)
    [group] = state["optimizer"]["param_groups"]
    assert tuple(group["betas"]) == (0.9, 0.95) and group["weight_decay"] == 0.0
