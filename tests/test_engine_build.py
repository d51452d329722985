"""launch/vllm_engine: which kernel library this CPU loads (kernels.py), and build.sh's guard that an
engine is marked built, or reused, only once vLLM's own loader has loaded its kernels here."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "launch" / "vllm_engine"


def load_kernels_module():
    spec = importlib.util.spec_from_file_location("engine_kernels", ENGINE / "kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernels = load_kernels_module()


def test_the_flags_it_reads_give_torchs_answers_on_this_cpu():
    """The build picks its library from /proc/cpuinfo before torch is installed; vLLM picks it from
    torch's probes. On this machine's CPU the two must agree, probe by probe."""
    flags = kernels.host_flags()
    assert all(f in flags for f in kernels.AVX512) == torch.cpu._is_avx512_supported()
    assert (kernels.AVX512_BF16 in flags) == torch.cpu._is_avx512_bf16_supported()
    by_torch = kernels.library_for(torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported())
    assert kernels.library_for_flags(flags) == by_torch


@pytest.mark.parametrize(
    ("flags", "library"),
    [
        ("avx2 fma", "_C_AVX2"),
        ("avx2 avx512f avx512vl avx512bw", "_C_AVX2"),  # no DQ: torch says no AVX-512
        ("avx2 avx512_bf16", "_C_AVX2"),  # BF16 alone does not make AVX-512
        ("avx2 avx512f avx512vl avx512bw avx512dq", "_C_AVX512"),
        ("avx2 avx512f avx512vl avx512bw avx512dq avx512_vnni avx512_bf16", "_C"),
    ],
)
def test_the_library_follows_vllms_order_of_tests(flags, library):
    text = f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\nbugs\t\t: spectre_v1\n"
    assert kernels.library_for_flags(kernels.cpu_flags(text)) == library


def test_a_cpuinfo_without_flags_is_an_error():
    with pytest.raises(ValueError, match="no 'flags' line"):
        kernels.cpu_flags("processor\t: 0\n")


FAILING_CHECK = "vllm-engine: the engine cannot start on this CPU: (planted)"


def staged_engine(tmp_path: Path, *, installed: bool) -> tuple[list[str], dict[str, str], Path]:
    """build.sh in a copy of the repository, its cache holding every step but the install (or all of
    them) and a venv whose python passes everything except the kernels' check."""
    repo = tmp_path / "repo"
    shutil.copytree(ENGINE, repo / "launch" / "vllm_engine")
    command = ["bash", str(repo / "launch" / "vllm_engine" / "build.sh")]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "EMOJI_RL_CACHE": str(tmp_path / "cache")}
    venv = Path(
        subprocess.run(
            [*command, "--print-venv"], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    work = venv.parent
    steps = ["system-packages", "sdist", "venv", "unpack-and-patch", "requirements", "torch-cmake", "compile"]
    (work / "done").mkdir(parents=True)
    for name in steps + (["install"] if installed else []):
        (work / "done" / name).touch()
    (work / "wheel").mkdir()
    (work / "wheel" / "vllm-0.33.0+cpu-cp38-abi3-linux_x86_64.whl").touch()
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        f'#!/bin/bash\ncase "$*" in *"kernels.py check"*) echo "{FAILING_CHECK}" >&2; exit 1;; esac\n'
    )
    python.chmod(0o755)
    return command, env, work


def test_a_build_whose_kernels_do_not_load_is_never_marked_built(tmp_path):
    command, env, work = staged_engine(tmp_path, installed=False)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "vllm-engine: step 'install' failed" in result.stderr
    assert FAILING_CHECK in result.stderr  # the check's own message, with the flags and libraries
    assert not (work / "done" / "install").exists()
    assert not (tmp_path / "repo" / ".venv-vllm-engine").exists()


def test_a_cached_engine_that_does_not_load_here_is_refused_naming_its_folder(tmp_path):
    command, env, work = staged_engine(tmp_path, installed=True)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert FAILING_CHECK in result.stderr
    assert f"the cached engine at {work} does not load here; remove that folder" in result.stderr
    assert not (tmp_path / "repo" / ".venv-vllm-engine").exists()
