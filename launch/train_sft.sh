#!/usr/bin/env bash
# LoRA SFT over NGPUS GPUs of this machine with `accelerate launch` (DDP, or FSDP for models that
# do not fit one GPU). Extra arguments go to `emoji-rl sft` and win over the config file.
#
#   launch/train_sft.sh                                   # all GPUs, DDP, configs/gpu/sft.yaml
#   NGPUS=4 STRATEGY=fsdp launch/train_sft.sh --output_dir runs/sft-fsdp
#   launch/train_sft.sh --resume true                     # go on from the last checkpoint
#   launch/train_sft.sh --dry-run                         # print the command, run nothing
#
# Settings (environment, default):
#   NGPUS      number of processes, one per GPU   (GPUs that nvidia-smi lists, else 1)
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

dry_run=0
args=()
for arg in "$@"; do
  if [[ "$arg" == "--dry-run" ]]; then dry_run=1; else args+=("$arg"); fi
done

if [[ -z "${NGPUS:-}" ]]; then
  NGPUS=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
  [[ "$NGPUS" -ge 1 ]] || NGPUS=1
fi
STRATEGY=${STRATEGY:-ddp}
CONFIG=${CONFIG:-configs/gpu/sft.yaml}
MAIN_PORT=${MAIN_PORT:-29500}
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

case "$STRATEGY" in
  ddp|fsdp) ;;
  *) echo "train_sft.sh: STRATEGY=$STRATEGY must be ddp or fsdp" >&2; exit 2 ;;
esac
if ! [[ "$NGPUS" =~ ^[1-9][0-9]*$ ]]; then
  echo "train_sft.sh: NGPUS=$NGPUS must be a positive integer" >&2; exit 2
fi

cmd=(
  "$PYTHON" -m accelerate.commands.launch
  --config_file "configs/accelerate/$STRATEGY.yaml"
  --num_processes "$NGPUS"
  --main_process_port "$MAIN_PORT"
  -m emoji_rl.cli sft --config "$CONFIG" ${args[@]+"${args[@]}"}
)
if [[ "$dry_run" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
