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

from emoji_rl import cli, models, selftest

CUDA_CHECKS = ("linear-attention-prefill", "linear-attention-decode", "sizing")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a machine without CUDA reports")


def run(tmp_path, *args: str) -> tuple[int, dict]:
    status = cli.main(["selftest", "--out_dir", str(tmp_path), *args])
    return status, json.loads((tmp_path / "selftest.json").read_text())


@no_cuda
@pytest.mark.slow
def test_every_check_passes_or_skips_on_the_cpu_and_the_cuda_ones_say_why(tmp_path, capsys):
    # ~60 s on 2 cores: sampling cut to 3 s, and no check may take a minute.
    status, report = run(tmp_path, "--sampling_seconds", "3", "--check_seconds", "60")
    statuses = {row["check"]: row["status"] for row in report["checks"]}
    assert list(statuses) == list(selftest.CHECKS)
    assert status == 0, report["checks"]
    assert all(statuses[name] == "SKIP" for name in CUDA_CHECKS), statuses
    assert all(s == "PASS" for name, s in statuses.items() if name not in CUDA_CHECKS), report["checks"]
    figures = {row["check"]: row["figure"] for row in report["checks"]}
    assert figures["linear-attention-prefill"] == "no CUDA"
    assert figures["sizing"].startswith("no CUDA; the gpu profile's trainer needs")
    assert figures["grammar-sampling"].endswith(": 0 masked")
    assert report["not_yet_checked"] == list(selftest.NOT_YET_CHECKED)
    printed = capsys.readouterr().out
    assert all(f"\n{name}" in printed for name in selftest.CHECKS)
    markdown = (tmp_path / "selftest.md").read_text()
    assert "| grammar-bitmask | PASS |" in markdown
    assert "## Not yet checked" in markdown


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
    monkeypatch.setattr(selftest, "_need_cuda", lambda runtime: None)
    # The torch reference is slow on a CPU: three chunks of 64, the last partial, are enough here.
    monkeypatch.setattr(selftest, "PREFILL_LENGTH", 150)

    def use(wrap=lambda kernel: kernel) -> None:
        monkeypatch.setattr(
            selftest, "_gated_delta_rule", lambda name: (wrap(references[name]), references[name])
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


def test_the_selftest_wheels_pin_what_the_suite_runs_and_leave_out_only_what_is_listed():
    pins = {}
    for line in SELFTEST_REQUIREMENTS.read_text().splitlines():
        if line.split("#")[0].strip():
            requirement = Requirement(line.split("#")[0])
            pins[canonicalize_name(requirement.name)] = str(requirement.specifier).removeprefix("==")
    assert pins == {name: metadata.version(name) for name in pins}
    with_torch = {canonicalize_name(Requirement(r).name) for r in metadata.requires("torch")} | {"torch"}
    declared = {
        canonicalize_name(requirement.name)
        for name in pins
        for requirement in map(Requirement, metadata.requires(name) or [])
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""})
    }
    assert declared - set(pins) - with_torch == set(LEFT_OUT)
