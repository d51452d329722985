"""The kernel sets (`ATEN_CPU_CAPABILITY`) PyTorch can run on this CPU. Unasked, torch picks the best
the CPU has (its own cpuinfo check: AVX-512 needs F, BW, DQ and VL; AVX2 needs FMA too); every set
below that one runs as well. Asked for one, torch trusts the name, so a set above the default is
never tried: it would stop on an illegal instruction.

    python tests/capabilities.py           # all of them, the default first: avx512 avx2 default
    python tests/capabilities.py --other   # the one below the default: what the next machine may pick

`make test` runs the `float_paths` tests (tests/floats.py) again under `--other`, so an AVX-512
machine also sees the rounding an AVX2 machine sees, and an AVX2 machine the scalar kernels'.
"""

from __future__ import annotations

import os
import subprocess
import sys

NAMES = ("avx512", "avx2", "default")  # torch's x86 names for ATEN_CPU_CAPABILITY, best first


def default() -> str:
    """The capability torch picks for this CPU when not asked (in a fresh process, as it is read once)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    code = "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return run.stdout.strip()


def supported() -> list[str]:
    """Every capability this CPU runs, the default first."""
    best = default()
    return list(NAMES[NAMES.index(best) :]) if best in NAMES else [best]


def main(argv: list[str]) -> None:
    names = supported()
    print(" ".join(names[1:2] if "--other" in argv else names))


if __name__ == "__main__":
    main(sys.argv[1:])
