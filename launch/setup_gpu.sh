#!/usr/bin/env bash
# The trainer's CUDA kernels on a GPU box, compiled here for this box's GPUs: flash-attn 2 and
# Qwen3.5's linear-attention kernels (flash-linear-attention, causal-conv1d), the `gpu` extra of
# pyproject.toml, into .venv (made first by make setup; `make setup-gpu` runs both and make setup-vllm).
# flash-attn 2.8.3 compiles its 80 .cu files for every architecture FLASH_ATTN_CUDA_ARCHS names
# (80;90;100;120 unless set), and torch compiles them one at a time when no `ninja` is on the PATH:
# hours. This script installs ninja into .venv, puts .venv/bin first on the PATH (torch looks for
# ninja there only), and compiles for this box's GPUs only, MAX_JOBS files at a time.
#
#   launch/setup_gpu.sh                          # for the GPUs nvidia-smi lists
#   CUDA_ARCHS=8.0,9.0 launch/setup_gpu.sh       # for A100s and H100s alike (a shared venv)
#   launch/setup_gpu.sh --dry-run                # print the commands, run nothing
#
# Settings (environment, default):
#   CUDA_ARCHS    compute capabilities to compile for, e.g. 9.0 (H100), 8.0 (A100), 8.9 (L40S),
#                 separated by commas or spaces     (nvidia-smi's compute_cap of this box's GPUs)
#   MAX_JOBS      files compiled at once            (flash-attn's own rule: half the cores, and no more
#                 than one per 9 GB of available memory: an nvcc job with 4 threads peaks near 9 GB)
#   NVCC_THREADS  threads of each nvcc              (4, flash-attn's default)
#   PYTHON        the trainer's interpreter         (.venv/bin/python)
# nvcc must be on the PATH (or CUDA_HOME set): the CUDA toolkit of the CUDA version torch was built
# with (`.venv/bin/python -c 'import torch; print(torch.version.cuda)'`).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"
[[ ${#ARGS[@]} -eq 0 ]] || die "unexpected arguments: ${ARGS[*]} (settings come from the environment)"

PYTHON=${PYTHON:-.venv/bin/python}
[[ -x "$PYTHON" || "$DRY_RUN" == 1 ]] || die "no $PYTHON: run make setup first (make setup-gpu does)"
if [[ -z "${CUDA_ARCHS:-}" ]]; then
  CUDA_ARCHS=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sort -u | tr '\n' ' ' || true)
fi
[[ -n "${CUDA_ARCHS// /}" ]] \
  || die "nvidia-smi lists no GPU here: set CUDA_ARCHS to the compute capabilities to compile for (e.g. 9.0)"
command -v nvcc > /dev/null || [[ -n "${CUDA_HOME:-}" ]] \
  || die "no nvcc on the PATH and no CUDA_HOME: install the CUDA toolkit torch was built with, and put its bin on the PATH"

# flash-attn compiles for 80 (every 8.x card runs sm_80 code), 90, 100 and 120; torch's extensions
# (causal-conv1d) take TORCH_CUDA_ARCH_LIST as the capabilities themselves.
torch_archs=() flash_archs=()
for cap in ${CUDA_ARCHS//,/ }; do
  [[ "$cap" =~ ^([0-9]+)\.([0-9])$ ]] || die "CUDA_ARCHS: '$cap' is not a compute capability such as 9.0"
  case "${BASH_REMATCH[1]}" in
    8) flash=80 ;;
    9) flash=90 ;;
    10) flash=100 ;;
    12) flash=120 ;;
    *) die "compute capability $cap: flash-attn 2 runs on 8.0 (Ampere) and newer" ;;
  esac
  [[ " ${torch_archs[*]} " == *" $cap "* ]] || torch_archs+=("$cap")
  [[ " ${flash_archs[*]} " == *" $flash "* ]] || flash_archs+=("$flash")
done
if [[ -z "${MAX_JOBS:-}" ]]; then
  cores=$(nproc)
  available_gb=$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)
  MAX_JOBS=$(( cores / 2 < available_gb / 9 ? cores / 2 : available_gb / 9 ))
  (( MAX_JOBS >= 1 )) || MAX_JOBS=1
fi
require_int MAX_JOBS "$MAX_JOBS" 1
NVCC_THREADS=${NVCC_THREADS:-4}
require_int NVCC_THREADS "$NVCC_THREADS" 1

# torch finds ninja on the PATH only: .venv/bin is put first, activated or not.
bin_dir=$(dirname "$(command -v "$PYTHON" || echo "$PYTHON")")
[[ "$bin_dir" == /* ]] || bin_dir=$PWD/$bin_dir
IFS=';'
build_env=(
  "PATH=$bin_dir:$PATH" "MAX_JOBS=$MAX_JOBS" "NVCC_THREADS=$NVCC_THREADS"
  "TORCH_CUDA_ARCH_LIST=${torch_archs[*]}" "FLASH_ATTN_CUDA_ARCHS=${flash_archs[*]}"
)
unset IFS
ninja=("$PYTHON" -m pip install --quiet ninja)
build=(env "${build_env[@]}" "$PYTHON" -m pip install --no-build-isolation -e '.[gpu]')
if [[ "$DRY_RUN" == 1 ]]; then
  print_cmd "${ninja[@]}"
  print_cmd "${build[@]}"
  exit 0
fi
"${ninja[@]}"
"${build[@]}"
