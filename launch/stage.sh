#!/usr/bin/env bash
# Any emoji-rl stage on the trainer's GPUs, TRAIN_GPUS: the judge (and policy) servers hold the others.
# For the stages that load a model in-process beside the servers (rl-prompts, eval-sft, judge-check);
# configs/gpu/experiment.yaml runs them through launch/with_servers.sh.
#
#   launch/stage.sh rl-prompts --config configs/gpu/rl_prompts.yaml
#   GPUS=8 launch/stage.sh eval-sft --config configs/gpu/eval_sft.yaml --limit 200
#   launch/stage.sh rl-prompts --config configs/gpu/rl_prompts.yaml --dry-run   # print the command
#
# Settings (environment, default):
#   GPUS        the box's GPU count: picks the layout   (what nvidia-smi lists, else 1)
#   TRAIN_GPUS  CUDA_VISIBLE_DEVICES of the stage       (the layout's: 1 on 2 GPUs, 3 on 4, 4,5,6,7 on 8)
#   JUDGE_GPUS, POLICY_GPUS  checked: none may share a GPU with TRAIN_GPUS
#   PYTHON      interpreter with emoji-rl installed     (.venv/bin/python if present, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"
[[ ${#ARGS[@]} -gt 0 ]] || die "usage: launch/stage.sh STAGE [--field value ...] (--help: the settings)"

pick_python
gpu_layout
on_cpu || [[ -n "$TRAIN_GPUS" ]] || die "TRAIN_GPUS is empty: the stage needs a GPU for its model"

on_cpu || require_free_gpus "$TRAIN_GPUS"
run env "CUDA_VISIBLE_DEVICES=$TRAIN_GPUS" "$PYTHON" -m emoji_rl.cli "${ARGS[@]}"
