#!/usr/bin/env bash
# Retrieval evaluation (base vs SFT vs RL on the held-out split) on the trainer's GPUs, TRAIN_GPUS:
# the judge (and policy) servers hold the others, and the senders it compares run in this process.
# Extra arguments go to `emoji-rl eval-retrieval` and win over the config file.
#
#   launch/eval_retrieval.sh                            # TRAIN_GPUS, configs/gpu/eval_retrieval.yaml
#   GPUS=8 launch/eval_retrieval.sh --max_examples 64
#   launch/eval_retrieval.sh --dry-run                  # print the command, run nothing
#
# Settings (environment, default):
#   GPUS        the box's GPU count: picks the layout   (what nvidia-smi lists, else 1)
#   TRAIN_GPUS  CUDA_VISIBLE_DEVICES of the evaluation  (the layout's: 1 on 2 GPUs, 3 on 4, 4,5,6,7 on 8)
#   JUDGE_GPUS, POLICY_GPUS  checked: none may share a GPU with TRAIN_GPUS
#   CONFIG      emoji-rl eval-retrieval config file     (configs/gpu/eval_retrieval.yaml)
#   PYTHON      interpreter with emoji-rl installed     (.venv/bin/python if present, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"

CONFIG=${CONFIG:-configs/gpu/eval_retrieval.yaml}
pick_python
gpu_layout
on_cpu || [[ -n "$TRAIN_GPUS" ]] || die "TRAIN_GPUS is empty: the evaluation needs a GPU for its senders"

on_cpu || require_free_gpus "$TRAIN_GPUS"
run env "CUDA_VISIBLE_DEVICES=$TRAIN_GPUS" "$PYTHON" -m emoji_rl.cli eval-retrieval --config "$CONFIG" \
  ${ARGS[@]+"${ARGS[@]}"}
