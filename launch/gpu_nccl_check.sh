#!/usr/bin/env bash
# NCCL's lost-peer path on one GPU of this box, in under 6 minutes, for the first GPU this project is
# lent (nothing here has run on one): a collective queued behind torch.cuda._sleep times out after
# --timeout_s (10 s) in a process group of one process, as one whose peer is gone does. It checks what
# docs/gpu/README.md ("A node lost") says of it, read from torch's ProcessGroupNCCL.cpp: the error
# reaches Python about 60 s after the timeout (the watchdog's pause), and then, with this project's
# settings (TORCH_NCCL_ASYNC_ERROR_HANDLING=2, TORCH_NCCL_DUMP_ON_TIMEOUT=0), the process ends at
# once; with torch's flight-recorder dump on, its exit is held up by the heartbeat monitor's sleep
# (shortened here to 60 s) or ends in SIGABRT. PASS or FAIL per variant, with the figures
# (python -m emoji_rl.selftest.nccl_check --help).
#
#   launch/gpu_nccl_check.sh                          # on GPU 0
#   NCCL_CHECK_GPU=3 launch/gpu_nccl_check.sh --variants ours
#   launch/gpu_nccl_check.sh --dry-run                # print the command, run nothing
#
# Settings (environment, default):
#   NCCL_CHECK_GPU  the GPU it runs on                    (0)
#   PYTHON          interpreter with emoji-rl installed   (.venv/bin/python if present, else python3)
# Extra arguments go to python -m emoji_rl.selftest.nccl_check (--variants, --timeout_s, --heartbeat_s).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"

pick_python
NCCL_CHECK_GPU=${NCCL_CHECK_GPU:-0}
require_int NCCL_CHECK_GPU "$NCCL_CHECK_GPU" 0
run env "CUDA_VISIBLE_DEVICES=$NCCL_CHECK_GPU" "$PYTHON" -m emoji_rl.selftest.nccl_check ${ARGS[@]+"${ARGS[@]}"}
