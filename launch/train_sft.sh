#!/usr/bin/env bash
# LoRA SFT over the GPUs of this machine (or of NNODES machines) with `accelerate launch` (DDP, or
# FSDP for models that do not fit one GPU) or `torchrun`, one process per GPU. SFT runs alone, before the servers (it needs neither the
# judge nor the policy server): it takes every GPU, not the layout's TRAIN_GPUS, unless TRAIN_GPUS
# is set. It refuses GPUs something already holds (nvidia-smi), naming the processes and the GPUs
# free now: stop servers started by hand first, or set TRAIN_GPUS to the free ones. Extra arguments
# go to `emoji-rl sft` and win over the config file.
#
#   launch/train_sft.sh                                   # all GPUs, DDP, configs/gpu/sft.yaml
#   TRAIN_GPUS=2,3 launch/train_sft.sh                    # beside servers already on GPUs 0-1
#   NGPUS=4 STRATEGY=fsdp launch/train_sft.sh --output_dir runs/sft-fsdp
#   launch/train_sft.sh --resume true                     # go on from the last checkpoint
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 launch/train_sft.sh   # on node 1 (node 0: NODE_RANK=0)
#   launch/train_sft.sh --dry-run                         # print the command, run nothing
#
# Settings (environment, default):
#   NGPUS       processes on this node, one per GPU (GPUS: what nvidia-smi lists, else 1; GPUS=0: 1);
#               every node must run as many
#   TRAIN_GPUS  CUDA_VISIBLE_DEVICES of the run    (unset: all; set, NGPUS must be its count)
#   NNODES      nodes in the job                   (1)
#   NODE_RANK   this node's rank, 0..NNODES-1      (0)
#   MASTER_ADDR address of node 0, reachable from all (127.0.0.1 on one node; NNODES > 1 needs it set,
#               not to a loopback address unless GPUS=0)
#   MASTER_PORT rendezvous port on node 0          (29500; change it to run two jobs at once)
#   LAUNCHER    accelerate | torchrun              (accelerate)
#   STRATEGY    ddp | fsdp, for accelerate         (ddp: configs/accelerate/ddp.yaml)
#   CONFIG      emoji-rl sft config file           (configs/gpu/sft.yaml)
#   PYTHON      interpreter with emoji-rl installed (.venv/bin/python if present, else python3)
# effective_batch_size (128) stays the same for any NGPUS x NNODES: gradient accumulation is derived
# from it.
#
# Without GPUs (or with GPUS=0) the NGPUS processes run on the CPU over gloo (DDP; STRATEGY=fsdp
# runs DDP too, as accelerate shards only on GPUs), in fp32: `dtype` decides, not the yaml's bf16. Checked with
# NGPUS=2 CONFIG=configs/cpu/sft.yaml; tests/sft/test_distributed.py launches accelerate this way.
# Do not add accelerate's --cpu: with it `--num_processes 2` starts ONE process (accelerate 1.15
# spreads CPU processes only through mpirun).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"

CONFIG=${CONFIG:-configs/gpu/sft.yaml}
pick_python
node_settings

envs=()
if [[ -n "${TRAIN_GPUS:-}" ]]; then
  check_ngpus "$TRAIN_GPUS" "TRAIN_GPUS=$TRAIN_GPUS"
  NGPUS=$(count_list "$TRAIN_GPUS")
  envs=("CUDA_VISIBLE_DEVICES=$TRAIN_GPUS")
elif [[ "${GPUS:-}" == 0 ]]; then
  NGPUS=${NGPUS:-1}
  envs=("CUDA_VISIBLE_DEVICES=")
fi
NGPUS=${NGPUS:-${GPUS:-$(count_gpus)}}
require_int NGPUS "$NGPUS" 1

require_free_gpus "${TRAIN_GPUS:-all}"
launcher "$NGPUS"
cmd=("${LAUNCH[@]}" -m emoji_rl.cli sft --config "$CONFIG" ${ARGS[@]+"${ARGS[@]}"})
if [[ ${#envs[@]} -gt 0 ]]; then cmd=(env "${envs[@]}" "${cmd[@]}"); fi
run "${cmd[@]}"
