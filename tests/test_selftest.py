"""`emoji-rl selftest` on the CPU: every check runs or says why not, a failing check fails the run,
and the CUDA checks' own code runs with transformers' torch reference standing in for fla."""

from __future__ import annotations

import inspect
import json
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from emoji_rl import cli, selftest
from emoji_rl.lm import models
from emoji_rl.selftest import kernels

CUDA_CHECKS = ("linear-attention-prefill", "linear-attention-decode", "sizing")
# Everything but the kernel checks, the stages and sampling: seconds on a CPU.
QUICK = ("environment", "nccl", "chunked-head")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a machine without CUDA reports")


def run(tmp_path, *args: str) -> tuple[int, dict]:
    status = cli.main(["selftest", "--out_dir", str(tmp_path), *args])
    return status, json.loads((tmp_path / "selftest.json").read_text())


@no_cuda
@pytest.mark.slow
def test_every_check_passes_or_skips_on_the_cpu_and_the_cuda_ones_say_why(tmp_path, capsys):
    # ~100 s on 2 cores, sampling cut to 3 s. The bound only catches a hang: with a second torch process
    # on one of the cores, the grpo stage's 3 steps took 30 s each (idle: 24 s for all three).
    status, report = run(tmp_path, "--sampling_seconds", "3", "--check_seconds", "240")
    statuses = {row["check"]: row["status"] for row in report["checks"]}
    assert list(statuses) == list(selftest.CHECKS)
    assert status == 0, report["checks"]
    assert all(statuses[name] == "SKIP" for name in CUDA_CHECKS), statuses
    assert all(s == "PASS" for name, s in statuses.items() if name not in CUDA_CHECKS), report["checks"]
    figures = {row["check"]: row["figure"] for row in report["checks"]}
    assert figures["linear-attention-prefill"] == "no CUDA"
    assert figures["sizing"].startswith("no CUDA; a layer keeps ")
    assert figures["nccl"].startswith("gloo (no CUDA)") and figures["nccl"].endswith("values as sent")
    assert figures["grammar-sampling"].endswith(": 0 masked")
    assert report["not_yet_checked"] == list(selftest.NOT_YET_CHECKED)
    printed = capsys.readouterr().out
    assert all(f"\n{name}" in printed for name in selftest.CHECKS)
    markdown = (tmp_path / "selftest.md").read_text()
    assert "| grammar-bitmask | PASS |" in markdown
    assert "## Not yet checked" in markdown
    assert "| sft-steps | PASS |" in markdown and "| grpo-steps | PASS |" in markdown


def test_a_check_that_raises_is_a_fail_with_its_last_line_and_exit_status_1(tmp_path, monkeypatch):
    def broken(cfg, runtime):
        raise RuntimeError("the kernel disagreed\nat row 3")

    monkeypatch.setitem(selftest.CHECKS, "environment", broken)
    status, report = run(tmp_path, "--only", "environment", "sizing")
    assert status == 1
    rows = {row["check"]: row for row in report["checks"]}
    assert rows["environment"]["status"] == "FAIL"
    assert rows["environment"]["figure"] == "at row 3"
    assert rows["sizing"]["status"] in {"PASS", "SKIP"}


def test_a_check_past_its_time_bound_fails_and_the_next_one_runs(tmp_path, monkeypatch):
    monkeypatch.setitem(selftest.CHECKS, "environment", lambda cfg, runtime: time.sleep(30))
    started = time.monotonic()
    status, report = run(tmp_path, "--only", "environment", "sizing", "--check_seconds", "0.5")
    assert time.monotonic() - started < 10
    assert status == 1
    assert report["checks"][0]["status"] == "FAIL"
    assert "still running after 0.5 s" in report["checks"][0]["figure"]
    assert report["checks"][1]["check"] == "sizing"


def test_an_unknown_check_name_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["selftest", "--out_dir", str(tmp_path), "--only", "kernels"]) == 2
    assert "unknown check(s) kernels" in capsys.readouterr().err


@no_cuda
def test_the_cuda_checks_skip_saying_no_cuda(tmp_path):
    status, report = run(tmp_path, "--only", *CUDA_CHECKS)
    assert status == 0
    assert [row["status"] for row in report["checks"]] == ["SKIP"] * len(CUDA_CHECKS)
    assert all(row["figure"].startswith("no CUDA") for row in report["checks"])


@pytest.fixture
def reference_as_kernel(monkeypatch):
    """The kernel checks on the CPU, with transformers' torch reference in fla's place: what a GPU
    runs, but for the kernel itself. `wrap` changes the stand-in kernel."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    references = {
        "chunk": inspect.unwrap(qwen.torch_chunk_gated_delta_rule),
        "fused_recurrent": inspect.unwrap(qwen.torch_recurrent_gated_delta_rule),
    }
    monkeypatch.setattr(kernels, "need_cuda", lambda runtime: None)
    # The torch reference is slow on a CPU: three chunks of 64, the last partial, are enough here.
    monkeypatch.setattr(kernels, "PREFILL_LENGTH", 150)

    def use(wrap=lambda kernel: kernel) -> None:
        monkeypatch.setattr(
            kernels, "_gated_delta_rule", lambda name: (wrap(references[name]), references[name])
        )

    return use


@pytest.mark.parametrize("name", ["linear-attention-prefill", "linear-attention-decode"])
def test_the_kernel_checks_pass_a_kernel_that_computes_the_reference(name, reference_as_kernel):
    reference_as_kernel()
    row = selftest.run_check(name, selftest.Config(), models.pick_runtime("cpu"))
    assert row.status == "PASS", row
    assert all(float(value.split()[0]) < 0.01 for value in row.details.values()), row.details


@pytest.mark.parametrize("name", ["linear-attention-prefill", "linear-attention-decode"])
def test_the_kernel_checks_fail_a_kernel_that_groups_the_value_heads_the_wrong_way(name, reference_as_kernel):
    # Key head i serves value heads 2i and 2i+1 (repeat_interleave); tiling makes it serve i and i+16.
    def tiled(kernel):
        return lambda q, k, v, **kw: kernel(q.repeat(1, 1, 2, 1), k.repeat(1, 1, 2, 1), v, **kw)

    reference_as_kernel(tiled)
    row = selftest.run_check(name, selftest.Config(), models.pick_runtime("cpu"))
    assert row.status == "FAIL"
    assert "over tolerance: output" in row.figure


def test_the_chunked_head_fails_against_a_reference_of_the_wrong_tokens(monkeypatch):
    right = kernels.fp32_head
    monkeypatch.setattr(
        kernels, "fp32_head", lambda hidden, weight, targets: right(hidden, weight, targets.roll(1))
    )
    row = selftest.run_check("chunked-head", selftest.Config(), models.pick_runtime("cpu"))
    assert row.status == "FAIL", row
    assert (
        "over tolerance: log-probs" in row.figure and "entropy" not in row.figure.split("over tolerance")[1]
    )


@pytest.mark.parametrize(
    ("name", "module", "finder"),
    [
        ("sft-steps", "emoji_rl.sft.train", "checkpoint_to_resume"),
        ("grpo-steps", "emoji_rl.rl.trainer", "latest_checkpoint"),
    ],
)
def test_the_stage_checks_resume_at_the_next_step_and_fail_a_resume_that_starts_over(
    name, module, finder, monkeypatch
):
    runtime = models.pick_runtime("cpu")
    row = selftest.run_check(name, selftest.Config(), runtime)
    assert row.status == "PASS", row
    assert row.figure.startswith("2 steps, then resumed: step 3; loss finite; adapter written")
    # The stage finds no checkpoint to go on from: its second run trains from step 0.
    monkeypatch.setattr(module + "." + finder, lambda *args, **kwargs: None)
    row = selftest.run_check(name, selftest.Config(), runtime)
    assert row.status == "FAIL", row
    assert "it started over" in row.figure


def test_the_grpo_check_fails_a_sampler_whose_log_probs_are_not_the_trainers(monkeypatch):
    from emoji_rl.rl import update

    real = update.update

    def shifted(*args, **kwargs):
        return real(*args, **kwargs) | {"sampler/kl_vs_trainer": 0.3}

    monkeypatch.setattr("emoji_rl.rl.trainer.update", shifted)
    row = selftest.run_check("grpo-steps", selftest.Config(), models.pick_runtime("cpu"))
    assert row.status == "FAIL"
    assert "sampler - trainer log-prob 3.0e-01" in row.figure


def test_sizing_advises_checkpointing_then_fewer_rows_as_the_card_shrinks():
    from emoji_rl.selftest.sizing import Plan

    plan = Plan("grpo.yaml", rows=8, tokens_per_row=500, checkpointing=False)
    per_token = 100e3  # 100 KB a layer a token: 32 layers x 4,000 tokens = 12.8 GB of activations
    assert plan.advice(10.0, per_token, 40.0) == (True, "grpo.yaml fits as configured (23 GB)")
    fits, text = plan.advice(10.0, per_token, 20.0)
    assert fits and text.startswith("grpo.yaml: set gradient_checkpointing: true (")
    assert plan.advice(10.0, per_token, 10.5) == (
        True,
        "grpo.yaml: set gradient_checkpointing: true, per_device_train_batch_size: 2 (10 GB)",
    )
    assert not plan.advice(10.0, per_token, 9.0)[0]


SELFTEST_REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements" / "selftest.txt"
# Declared by a package in requirements/selftest.txt, and never imported by a selftest: the GPU box installs
# the wheels with --no-deps (docs/gpu/SELFTEST.md), so these stay out of `make selftest-wheels`.
LEFT_OUT = {
    "typer": "transformers' CLI",
    "click": "huggingface_hub's CLI",
    "hf-xet": "huggingface_hub's downloads",
    "requests": "tiktoken fetching a URL",
    "triton": "on the GPU box with torch",
}


# Not installed in .venv (no CUDA): flash-linear-attention's pin is the gpu extra's, and their declared
# dependencies (the 0.6.0 wheels' METADATA, without extras) are these.
GPU_KERNELS = {
    "flash-linear-attention": {"fla-core", "transformers"},
    "fla-core": {"einops"},
    "einops": set(),
}


def test_the_selftest_wheels_pin_what_the_suite_runs_and_leave_out_only_what_is_listed():
    import tomllib

    pins = {}
    for line in SELFTEST_REQUIREMENTS.read_text().splitlines():
        if line.split("#")[0].strip():
            requirement = Requirement(line.split("#")[0])
            pins[canonicalize_name(requirement.name)] = str(requirement.specifier).removeprefix("==")
    installed = {name: version for name, version in pins.items() if name not in GPU_KERNELS}
    assert installed == {name: metadata.version(name) for name in installed}
    assert set(GPU_KERNELS) <= set(pins)
    pyproject = tomllib.loads((SELFTEST_REQUIREMENTS.parents[1] / "pyproject.toml").read_text())
    assert (
        "flash-linear-attention==" + pins["flash-linear-attention"]
        in pyproject["project"]["optional-dependencies"]["gpu"]
    )
    assert pins["fla-core"] == pins["flash-linear-attention"]
    with_torch = {canonicalize_name(Requirement(r).name) for r in metadata.requires("torch")} | {"torch"}
    declared = {
        canonicalize_name(requirement.name)
        for name in installed
        for requirement in map(Requirement, metadata.requires(name) or [])
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""})
    }
    declared |= set().union(*GPU_KERNELS.values())
    assert declared - set(pins) - with_torch == set(LEFT_OUT)
