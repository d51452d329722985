"""Which of vLLM's x86 kernel libraries this CPU loads, and a check that a built engine loads it.

vLLM 0.33 ships three builds of its CPU kernels for x86 and `CpuPlatform.import_kernels` picks one by
torch's CPU probes: `vllm._C` where AVX-512 and AVX-512 BF16 are present (the AMX build), `vllm._C_AVX512`
where AVX-512 is present without BF16, `vllm._C_AVX2` where there is no AVX-512. It never falls back:
a CPU whose library was not built starts no engine. build.sh builds the one library this CPU loads
and keys its cache by it (README.md beside this file says why this and not a patched loader).

    python3 kernels.py library   # the library this CPU loads, from /proc/cpuinfo (standard library only)
    python3 kernels.py check     # in the engine's venv: load the kernels as vLLM does, then the ops its
                                 # CPU worker and attention backend call; exit 1 naming what is missing

`library` runs before the engine's venv exists, so it reads the flags torch's probes read
(ATen's cpu/Utils.cpp over cpuinfo); `check` asks torch itself and fails if the two disagree.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

# torch.cpu._is_avx512_supported(): AVX-512 F, VL, BW and DQ (Linux's names for them).
AVX512 = ("avx512f", "avx512vl", "avx512bw", "avx512dq")
# torch.cpu._is_avx512_bf16_supported().
AVX512_BF16 = "avx512_bf16"
LIBRARIES = ("_C", "_C_AVX512", "_C_AVX2")
# What vLLM's CPU worker calls at start, and the CPU attention backend on every step (vllm/_custom_ops.py).
WORKER_OPS = (
    "init_cpu_memory_env",
    "get_scheduler_metadata",
    "cpu_attn_reshape_and_cache",
    "cpu_attention_with_kv_cache",
)


def library_for(avx512: bool, avx512_bf16: bool) -> str:
    """The library vLLM's import_kernels imports, given torch's two answers (its order of tests)."""
    if avx512:
        return "_C" if avx512_bf16 else "_C_AVX512"
    return "_C_AVX2"


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags of the first processor in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    raise ValueError("no 'flags' line in the cpuinfo text")


def library_for_flags(flags: set[str]) -> str:
    return library_for(all(f in flags for f in AVX512), AVX512_BF16 in flags)


def host_flags() -> set[str]:
    """This CPU's flags, or those of the CPU described in the file EMOJI_RL_CPUINFO names."""
    return cpu_flags(Path(os.environ.get("EMOJI_RL_CPUINFO", "/proc/cpuinfo")).read_text())


def isa_summary(flags: set[str]) -> str:
    """The flags that decide the library, for messages: what this CPU has of them."""
    named = [*AVX512, AVX512_BF16, "avx2", "amx_tile"]
    return " ".join(f for f in named if f in flags) or "none of " + " ".join(named)


def host_library() -> str:
    if platform.machine() not in ("x86_64", "AMD64"):
        return "_C"  # vLLM builds and loads the one library elsewhere
    return library_for_flags(host_flags())


def check() -> int:
    """Load the kernels the way vLLM's engine does and call what its CPU worker calls; 0 when it all works."""
    import torch
    from vllm.platforms.cpu import CpuPlatform

    flags = host_flags()
    by_torch = library_for(torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported())
    by_flags = library_for_flags(flags)
    package = Path(__import__("vllm").__file__).parent
    built = sorted(p.name for p in package.glob("_C*.so"))
    CpuPlatform.import_kernels()
    missing = [op for op in WORKER_OPS if not hasattr(torch.ops._C, op)]
    problems = []
    if by_torch != by_flags:
        problems.append(f"torch's probes choose vllm.{by_torch}, /proc/cpuinfo's flags vllm.{by_flags}")
    if missing:
        problems.append(
            f"vLLM loads vllm.{by_torch} on this CPU, and torch.ops._C lacks {', '.join(missing)}"
        )
    if not problems:
        from vllm.utils.cpu_resource_utils import get_visible_memory_node

        torch.ops._C.init_cpu_memory_env([get_visible_memory_node()[0]])
        print(
            f"vllm-engine: this CPU ({isa_summary(flags)}) loads vllm.{by_torch}: {', '.join(WORKER_OPS)} found"
        )
        return 0
    print(f"vllm-engine: the engine cannot start on this CPU: {'; '.join(problems)}.", file=sys.stderr)
    print(f"  CPU flags: {isa_summary(flags)}", file=sys.stderr)
    print(f"  kernel libraries in {package}: {', '.join(built) or 'none'}", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if argv == ["library"]:
        print(host_library())
        return 0
    if argv == ["check"]:
        return check()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
