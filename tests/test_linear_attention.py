"""Qwen3.5's linear-attention kernels: the gpu extra installs what transformers imports for them, a GPU
load without them warns, and padding-free batches without them are refused before training."""

from __future__ import annotations

import inspect
import logging
import tomllib
from pathlib import Path

import pytest
import torch
from tests.tiny import tiny_llama, tiny_qwen3_5

from emoji_rl.errors import UserError
from emoji_rl.lm import models

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
GPU = models.Runtime("cuda", torch.bfloat16, "sdpa")


def kernels_transformers_imports() -> dict[str, str]:
    """Import name -> distribution of the packages transformers' Qwen3.5 modeling runs its linear attention
    on: each function it wraps with `use_kernel_func_from_hub_with_fallback` keeps the package it imports
    in the wrapper's closure; the distribution is transformers' own mapping (`_PACKAGE_TO_DISTRIBUTION`)."""
    from transformers.integrations import hub_kernels
    from transformers.models.qwen3_5 import modeling_qwen3_5

    packages = set()
    for value in vars(modeling_qwen3_5).values():
        if inspect.isfunction(value) and value.__closure__:
            nonlocals = inspect.getclosurevars(value).nonlocals
            if {"package", "torch_function"} <= nonlocals.keys():
                packages.add(nonlocals["package"])
    assert packages, (
        "transformers' Qwen3.5 no longer wraps its kernels this way: read modeling_qwen3_5.py again"
    )
    return {package: hub_kernels._PACKAGE_TO_DISTRIBUTION.get(package, package) for package in packages}


def test_gpu_extra_installs_the_kernels_transformers_imports_for_qwen35():
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    wanted = kernels_transformers_imports()
    gpu = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["gpu"]
    extra = {canonicalize_name(Requirement(item).name) for item in gpu}
    assert {canonicalize_name(name) for name in wanted.values()} <= extra, (wanted, gpu)
    ours = {module: canonicalize_name(name) for module, name in models.LINEAR_ATTENTION_KERNELS.items()}
    assert ours == {module: canonicalize_name(name) for module, name in wanted.items()}


def test_gpu_load_without_kernels_warns_naming_the_extra(monkeypatch, caplog):
    monkeypatch.setattr(models, "missing_linear_attention_kernels", lambda: ["causal-conv1d"])
    with caplog.at_level(logging.WARNING, logger="emoji_rl.lm.models"):
        models.warn_if_slow_linear_attention(tiny_qwen3_5(), GPU)
    assert "causal-conv1d" in caplog.text and "'.[gpu]'" in caplog.text


@pytest.mark.parametrize(
    ("model", "runtime", "missing"),
    [
        (tiny_qwen3_5, GPU, []),  # kernels installed
        (tiny_qwen3_5, models.pick_runtime("cpu"), ["causal-conv1d"]),  # no CUDA kernels on a CPU anyway
        (tiny_llama, GPU, ["causal-conv1d"]),  # no linear attention
    ],
)
def test_no_warning_where_the_kernels_would_not_run(monkeypatch, caplog, model, runtime, missing):
    monkeypatch.setattr(models, "missing_linear_attention_kernels", lambda: missing)
    with caplog.at_level(logging.WARNING, logger="emoji_rl.lm.models"):
        models.warn_if_slow_linear_attention(model(), runtime)
    assert not caplog.records


def test_padding_free_without_kernels_is_refused_before_transformers_raises(monkeypatch):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    model = tiny_qwen3_5()
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
        [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]
    )
    if not models.missing_linear_attention_kernels():
        pytest.skip("the kernels are installed here")
    # The premise, from the real libraries: the first padding-free forward raises mid-training.
    with pytest.raises(ValueError, match="packed sequences"):
        model(**batch)
    with pytest.raises(UserError, match=r"sft_overrides: padding-free.*causal-conv1d.*'\.\[gpu\]'"):
        models.check_padding_free(True, model, "sft_overrides")


@pytest.mark.parametrize(
    ("padding_free", "model", "missing"),
    [
        (False, tiny_qwen3_5, ["causal-conv1d"]),
        (True, tiny_qwen3_5, []),
        (True, tiny_llama, ["causal-conv1d"]),
    ],
)
def test_padding_free_is_fine_where_nothing_would_raise(monkeypatch, padding_free, model, missing):
    monkeypatch.setattr(models, "missing_linear_attention_kernels", lambda: missing)
    models.check_padding_free(padding_free, model(), "sft_overrides")
