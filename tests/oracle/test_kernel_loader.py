"""vLLM's engine starts on every x86 CPU of our kind: the engine build makes the kernel library that
vLLM's own loader (`CpuPlatform.import_kernels`) imports, whatever torch's CPU probes answer.

Each CPU below is a /proc/cpuinfo flags line and the answers torch's probes give on it (ATen's
`is_avx512_supported`: AVX-512 F, VL, BW and DQ; `is_avx512_bf16_supported`: AVX-512 BF16). The build
reads the flags (`build.sh --print-library` with EMOJI_RL_CPUINFO); vLLM's code gets the answers.
`tests/test_launch.py` checks, on this machine's CPU, that the flags and torch's real probes agree."""

from __future__ import annotations

import os
import subprocess

import pytest
from tests.launching import ROOT

BUILD = ROOT / "launch" / "vllm_engine" / "build.sh"
BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx f16c fma avx2 bmi1 bmi2"
CPUS = {
    "AVX2 only": (BASE, (False, False)),
    "AVX-512 without BF16": (
        f"{BASE} avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni",
        (True, False),
    ),
    "AVX-512 with BF16 and AMX": (
        f"{BASE} avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8",
        (True, True),
    ),
}


def build_answer(flags: str, tmp_path, option: str) -> str:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\n")
    env = {**os.environ, "EMOJI_RL_CPUINFO": str(cpuinfo), "EMOJI_RL_CACHE": str(tmp_path / "cache")}
    return subprocess.run(
        ["bash", str(BUILD), option], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()


@pytest.mark.parametrize("cpu", CPUS)
def test_the_engine_build_makes_the_library_vllms_loader_imports(cpu, vllm_oracle, tmp_path):
    flags, (avx512, avx512_bf16) = CPUS[cpu]
    built = build_answer(flags, tmp_path, "--print-library")
    imported = vllm_oracle("import_kernels", avx512=avx512, avx512_bf16=avx512_bf16)
    assert imported == [f"vllm.{built}"], f"on {cpu} vLLM imports {imported}; the build makes vllm.{built}"


def test_an_engine_built_for_one_cpu_is_never_reused_on_another(tmp_path):
    """The library is part of the cache key: each CPU gets its own engine folder."""
    venvs = {cpu: build_answer(flags, tmp_path, "--print-venv") for cpu, (flags, _) in CPUS.items()}
    assert len(set(venvs.values())) == len(CPUS), venvs
