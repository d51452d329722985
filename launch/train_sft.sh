#!/usr/bin/env bash
# LoRA SFT over the GPUs of this machine with `accelerate launch` (DDP, or FSDP for models that
# do not fit one GPU), one process per GPU. SFT runs alone, before the servers (it needs neither the
# judge nor the policy server): it takes every GPU, not the layout's TRAIN_GPUS, unless TRAIN_GPUS
# is set. Extra arguments go to `emoji-rl sft` and win over the config file.
#
#   launch/train_sft.sh                                   # all GPUs, DDP, configs/gpu/sft.yaml
#   TRAIN_GPUS=2,3 launch/train_sft.sh                    # beside servers already on GPUs 0-1
#   NGPUS=4 STRATEGY=fsdp launch/train_sft.sh --output_dir runs/sft-fsdp
#   launch/train_sft.sh --resume true                     # go on from the last checkpoint
#   launch/train_sft.sh --dry-run                         # print the command, run nothing
#
# Settings (environment, default):
#   NGPUS      number of processes, one per GPU   (GPUS: what nvidia-smi lists, else 1)
#   TRAIN_GPUS CUDA_VISIBLE_DEVICES of the run    (unset: all; set, NGPUS must be its count)
#   STRATEGY   ddp | fsdp                         (ddp: configs/accelerate/ddp.yaml)
#   CONFIG     emoji-rl sft config file           (configs/gpu/sft.yaml)
#   MAIN_PORT  rendezvous port of process 0       (29500; change it to run two jobs at once)
#   PYTHON     interpreter with emoji-rl installed (.venv/bin/python if present, else python3)
# effective_batch_size (128) stays the same for any NGPUS: gradient accumulation is derived from it.
#
# Without GPUs the NGPUS processes run on the CPU over gloo (DDP; STRATEGY=fsdp runs DDP too, as
# accelerate shards only on GPUs), in fp32: `dtype` decides, not the yaml's bf16. Checked with
# NGPUS=2 CONFIG=configs/cpu/sft.yaml; tests/sft/test_distributed.py launches accelerate this way.
# Do not add accelerate's --cpu: with it `--num_processes 2` starts ONE process (accelerate 1.15
# spreads CPU processes only through mpirun).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"

STRATEGY=${STRATEGY:-ddp}
CONFIG=${CONFIG:-configs/gpu/sft.yaml}
MAIN_PORT=${MAIN_PORT:-29500}
pick_python

require_one_of STRATEGY "$STRATEGY" ddp fsdp
require_int MAIN_PORT "$MAIN_PORT" 1
envs=()
if [[ -n "${TRAIN_GPUS:-}" ]]; then
  check_ngpus "$TRAIN_GPUS" "TRAIN_GPUS=$TRAIN_GPUS"
  NGPUS=$(count_list "$TRAIN_GPUS")
  envs=("CUDA_VISIBLE_DEVICES=$TRAIN_GPUS")
fi
NGPUS=${NGPUS:-${GPUS:-$(count_gpus)}}
require_int NGPUS "$NGPUS" 1

cmd=(
  "$PYTHON" -m accelerate.commands.launch
  --config_file "configs/accelerate/$STRATEGY.yaml"
  --num_processes "$NGPUS"
  --main_process_port "$MAIN_PORT"
  -m emoji_rl.cli sft --config "$CONFIG" ${ARGS[@]+"${ARGS[@]}"}
)
if [[ ${#envs[@]} -gt 0 ]]; then cmd=(env "${envs[@]}" "${cmd[@]}"); fi
run "${cmd[@]}"
