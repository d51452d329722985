#!/usr/bin/env bash
# Build vLLM 0.33.0's engine for the CPU from its PyPI sdist and install it into its own venv, so the
# test suite (and anyone without a GPU) can run the real `vllm serve` on the embedded models.
# Idempotent: every step leaves a mark and is skipped once done; the wheel and the venv live in a
# cache outside the checkout, keyed by this script and its patches, so a clean clone on the same
# machine reuses them and an edit here builds afresh. A failure names its step and its log.
#
#   launch/vllm_engine/build.sh            # build or reuse; link .venv-vllm-engine to the venv
#   launch/vllm_engine/build.sh --print-venv   # the venv's path for this recipe and CPU, nothing built
#   launch/vllm_engine/build.sh --print-library   # the kernel library it builds for this CPU, nothing built
#
# Settings (environment, default):
#   EMOJI_RL_CACHE   the project's cache                    (~/.cache/emoji-rl)
#   MAX_JOBS         compile jobs                           (the machine's cores)
#   EMOJI_RL_CPUINFO the CPU to build for, as a /proc/cpuinfo text (/proc/cpuinfo)
#
# What it takes (README.md beside this file says why each workaround is needed):
#   - torch 2.14.1 from the registry (a CUDA build, used as a CPU library): vLLM's CPU requirements pin
#     torch==2.14.0+cpu, which the registry does not carry; vLLM's tools/use_existing_torch.py unpins it.
#   - vllm-cpu.patch: only the kernel library this CPU loads (kernels.py), oneDNN left out, gcc 12.2.
#   - torch-cmake-nocuda.patch: find_package(Torch) without a CUDA toolkit.
# The build ends by loading the kernels as vLLM's engine does (kernels.py check); a reused engine is
# checked the same way, in a few seconds. Cold build times are in README.md beside this file.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

VLLM_VERSION=0.33.0
SDIST_SHA256=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112
TORCH_PINS=(torch==2.14.1 torchvision==0.29.1)
PY=${PYTHON:-python3.11}

# The one x86 kernel library vLLM loads on this CPU (_C, _C_AVX512 or _C_AVX2): the only one built, so
# it is part of the key, and an engine built for another CPU is never reused here.
LIBRARY=$(python3 "$HERE/kernels.py" library)
# What the build is made of: the cache key. Comments and the steps' plumbing stay out of it, so that
# editing them does not cost a 20-minute rebuild; change one of these and the engine is rebuilt.
BUILD_ENV=(VLLM_TARGET_DEVICE=cpu "VLLM_CPU_EXTENSIONS=$LIBRARY" VLLM_CPU_DISABLE_ONEDNN=1 CMAKE_BUILD_TYPE=Release
  "CMAKE_ARGS=-DENABLE_AMX_FP8=OFF" CARGO_NET_OFFLINE=true SETUPTOOLS_SCM_PRETEND_VERSION=$VLLM_VERSION)
DROPPED_REQUIREMENTS='^(triton @|torchaudio|torchcodec)'
KEY=$( (echo "$VLLM_VERSION $SDIST_SHA256 ${TORCH_PINS[*]} ${BUILD_ENV[*]} $DROPPED_REQUIREMENTS $PY"
  cat "$HERE"/*.patch) | sha256sum | cut -c1-12)
ROOT=${EMOJI_RL_CACHE:-$HOME/.cache/emoji-rl}/vllm-engine
WORK=$ROOT/$KEY-vllm$LIBRARY
VENV=$WORK/venv
SRC=$WORK/src/vllm-$VLLM_VERSION
WHEEL_DIR=$WORK/wheel
LOGS=$WORK/logs
SDIST=$ROOT/sdist/vllm-$VLLM_VERSION.tar.gz

if [[ "${1:-}" == --print-venv ]]; then echo "$VENV"; exit 0; fi
if [[ "${1:-}" == --print-library ]]; then echo "$LIBRARY"; exit 0; fi
[[ $# -eq 0 ]] || { sed -n '2,/^[^#]/p' "$0" | sed -e '/^[^#]/d' -e 's/^# \{0,1\}//'; exit 0; }

export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export CMAKE_BUILD_PARALLEL_LEVEL=$MAX_JOBS
mkdir -p "$WORK" "$LOGS" "$(dirname "$SDIST")"

# step NAME COMMAND...: run once (a mark in $WORK/done), output to $LOGS/NAME.log, fail with both named.
step() {
  local name=$1
  shift
  if [[ -e "$WORK/done/$name" ]]; then return 0; fi
  echo "vllm-engine: $name ..." >&2
  local start=$SECONDS
  if ! "$@" >"$LOGS/$name.log" 2>&1; then
    echo "vllm-engine: step '$name' failed; the last lines of $LOGS/$name.log:" >&2
    tail -n 25 "$LOGS/$name.log" >&2
    exit 1
  fi
  mkdir -p "$WORK/done"
  touch "$WORK/done/$name"
  echo "vllm-engine: $name done in $((SECONDS - start)) s" >&2
}

system_packages() {
  # libnuma: the extension links it; tcmalloc: vLLM's CPU worker preloads it if present.
  local missing=()
  for pkg in libnuma-dev libtcmalloc-minimal4 g++ cmake; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

fetch_sdist() {
  # `pip download --no-binary` would try to build the sdist's metadata, which needs this very build:
  # take the file from the registry's simple index (PEP 691 JSON) and check its hash instead.
  if [[ ! -f "$SDIST" ]] || ! echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet; then
    "$PY" - "$SDIST" "vllm-$VLLM_VERSION.tar.gz" <<'EOF'
import json, sys, urllib.request
out, name = sys.argv[1], sys.argv[2]
req = urllib.request.Request("https://pypi.org/simple/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = {f["filename"]: f["url"] for f in json.load(urllib.request.urlopen(req, timeout=120))["files"]}
urllib.request.urlretrieve(files[name], out + ".part")
EOF
    mv "$SDIST.part" "$SDIST"
  fi
  echo "$SDIST_SHA256  $SDIST" | sha256sum -c
}

unpack_and_patch() {
  rm -rf "$WORK/src"
  mkdir -p "$WORK/src"
  tar xzf "$SDIST" -C "$WORK/src"
  cd "$SRC"
  patch -p1 <"$HERE/vllm-cpu.patch"
  # Unpin torch (and its companions) so the installed 2.14.1 is used; drop the requirements that
  # cannot be had here: triton-cpu is a download from outside the registry (vLLM disables Triton on
  # the CPU without its CPU backend), torchaudio and torchcodec serve audio and video models only.
  "$VENV/bin/python" tools/use_existing_torch.py --prefix
  sed -i -E "/$DROPPED_REQUIREMENTS/d" requirements/cpu.txt
  ! grep -nE "$DROPPED_REQUIREMENTS|^torch *[=<>]" requirements/cpu.txt
}

make_venv() {
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet "${TORCH_PINS[@]}" cmake ninja "packaging>=24.2" "setuptools==78.1.1" \
    "setuptools-scm>=8" "setuptools-rust>=1.9.0" wheel "jinja2>=3.1.6" regex
}

requirements() {
  cd "$SRC"
  "$VENV/bin/python" -m pip install --quiet -r requirements/cpu.txt "${TORCH_PINS[@]}"
}

torch_cmake() {
  cd "$VENV"/lib/python3.*/site-packages/torch/share/cmake
  grep -q 'stand-in takes its place' Caffe2/Caffe2Config.cmake || patch -p1 <"$HERE/torch-cmake-nocuda.patch"
}

compile_wheel() {
  cd "$SRC"
  rm -rf "$WHEEL_DIR"
  # The Rust frontend is optional at build time and off at run time; its crates are not reachable,
  # so setup.py skips it after a fast failure.
  env "${BUILD_ENV[@]}" PATH="$VENV/bin:$PATH" "$VENV/bin/python" setup.py bdist_wheel --dist-dir="$WHEEL_DIR" --py-limited-api=cp38
  ls "$WHEEL_DIR"/vllm-*.whl
}

install_wheel() {
  "$VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall "$WHEEL_DIR"/vllm-*.whl
  # Run it from outside the source tree, or Python imports the unbuilt package there.
  cd /
  "$VENV/bin/python" -c '
import vllm, torch
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
print("vllm", vllm.__version__, "on", current_platform.device_name, "torch", torch.__version__)
'
  load_kernels
}

# The engine's kernels loaded by vLLM's own import_kernels, then the ops its CPU worker calls: part of
# the install step (a build that fails it is never marked done) and run again on every reuse.
load_kernels() {
  (cd / && "$VENV/bin/python" "$HERE/kernels.py" check)
}

# An engine built by an earlier run is checked below; one built now was checked by its install step.
REUSED=$([[ -e "$WORK/done/install" ]] && echo yes || true)
step system-packages system_packages
step sdist fetch_sdist
step venv make_venv
step unpack-and-patch unpack_and_patch
step requirements requirements
step torch-cmake torch_cmake
step compile compile_wheel
step install install_wheel
if [[ -n "$REUSED" ]] && ! load_kernels; then
  echo "vllm-engine: the cached engine at $WORK does not load here; remove that folder to build it again" >&2
  exit 1
fi

ln -sfn "$VENV" "$REPO/.venv-vllm-engine"
echo "vllm-engine: ready: $REPO/.venv-vllm-engine -> $VENV" >&2
