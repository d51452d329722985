"""The programs on a simulated box's PATH and in its venvs: each GPU program is a shim that starts
client.py, the box's stand-in, where the real one would start; everything else runs for real.

- `nvidia-smi`, `nvcc`: stand-ins always (there is no GPU, no CUDA toolkit).
- `python3`: `-m venv DIR` makes a venv of the box (below); anything else is the real interpreter.
- a venv's `python`: the real interpreter with this test session's packages, as a venv of its own
  (its sys.executable is the venv's, so `emoji-rl pipeline` starts its stages through it too), except
  `-m emoji_rl.cli STAGE` (but `pipeline`), `-m accelerate.commands.launch`, `-m torch.distributed.run`,
  `-m pip` and the GPU benchmarks of gpu_smoke.sh, which are stand-ins. `pip install` of vllm puts a
  `vllm` stand-in into that venv, and of this project an `emoji-rl` that runs the venv's python.
- `sleep`: a twentieth of a second: the launchers' polling loops run on the box's clock, not the wall's.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

CLIENT = Path(__file__).with_name("client.py")
BASE_PYTHON = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
"""The interpreter this session's venv was made from."""
PACKAGES = Path(sysconfig.get_paths()["purelib"])
"""This session's site-packages, which every venv of a box shares."""

STANDIN = f'"{BASE_PYTHON}" -S "{CLIENT}"'
VENV_PYTHON = f"""#!/bin/bash
# A venv's python on a simulated GPU box (tests/rehearsal/shims.py).
case "$1:${{2:-}}" in
  -m:emoji_rl.cli) case "${{3:-pipeline}}" in pipeline|-h|--help) ;; *) exec {STANDIN} stage "$0" "${{@:3}}" ;; esac ;;
  -m:accelerate.commands.launch|-m:torch.distributed.run) exec {STANDIN} launcher "$0" "$@" ;;
  -m:emoji_rl.bench.sampling|-m:emoji_rl.bench.prefix_cache) exec {STANDIN} bench "$0" "$@" ;;
  -m:pip) exec {STANDIN} pip "$0" "${{@:3}}" ;;
  -m:venv) exec {STANDIN} venv "$0" "${{@:3}}" ;;
esac
exec -a "$0" "{BASE_PYTHON}" "$@"
"""
PATH_PYTHON = f"""#!/bin/bash
# python3 on a simulated GPU box's PATH (tests/rehearsal/shims.py).
[[ "${{1:-}}:${{2:-}}" == -m:venv ]] && exec {STANDIN} venv "$0" "${{@:3}}"
exec "{BASE_PYTHON}" "$@"
"""
EMOJI_RL = '#!/bin/bash\nexec "$(dirname "$0")/python" -m emoji_rl.cli "$@"\n'
PIP = '#!/bin/bash\nexec "$(dirname "$0")/python" -m pip "$@"\n'


def script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def standin(path: Path, kind: str) -> None:
    script(path, f'#!/bin/bash\nexec {STANDIN} {kind} "$0" "$@"\n')


def path_dir(directory: Path) -> Path:
    """The box's own programs, to put first on its PATH."""
    standin(directory / "nvidia-smi", "nvidia-smi")
    standin(directory / "nvcc", "nvcc")
    script(directory / "python3", PATH_PYTHON)
    script(directory / "sleep", f'#!/bin/bash\nexec "{shutil.which("sleep")}" 0.05\n')
    return directory


def make_venv(directory: Path) -> None:
    """What `python3 -m venv DIRECTORY` makes on the box: a venv whose python is the shim above."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    script(directory / "bin" / "python", VENV_PYTHON)
    for name in ("python3", f"python{version}"):
        link = directory / "bin" / name
        if not link.exists():
            link.symlink_to("python")
    script(directory / "bin" / "pip", PIP)
    (directory / "pyvenv.cfg").write_text(
        f"home = {BASE_PYTHON.parent}\ninclude-system-site-packages = false\nversion = {sys.version.split()[0]}\n"
    )
    packages = directory / "lib" / f"python{version}" / "site-packages"
    if not packages.exists():
        packages.parent.mkdir(parents=True, exist_ok=True)
        packages.symlink_to(PACKAGES)


def installed(venv: Path, requirement: str) -> None:
    """What `pip install REQUIREMENT` leaves in `venv`'s bin that a later command runs."""
    name = requirement.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()
    if name == "vllm":
        standin(venv / "bin" / "vllm", "vllm")
    elif name in (".", "-e."):
        script(venv / "bin" / "emoji-rl", EMOJI_RL)
    elif name == "ninja":
        standin(venv / "bin" / "ninja", "ninja")
