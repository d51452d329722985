#!/usr/bin/env bash
# Multi-turn GRPO over NGPUS GPUs per node and NNODES nodes, with `accelerate launch` (default) or
# `torchrun`. Each process rolls out its share of the batch and gradients are all-reduced. With the
# vllm engine, start launch/serve_policy.sh and launch/serve_judge.sh first, on other GPUs (see
# TRAIN_GPUS). Extra arguments go to `emoji-rl grpo` and win over the config file.
#
#   launch/train_grpo.sh                                       # this node's GPUs, configs/gpu/grpo.yaml
#   TRAIN_GPUS=3 NGPUS=1 launch/train_grpo.sh --max_steps 2    # GPUs 0-2 serve the judge and policy
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 launch/train_grpo.sh   # on node 0; NODE_RANK=1 on node 1
#   LAUNCHER=torchrun launch/train_grpo.sh
#   launch/train_grpo.sh --dry-run                             # print the command, run nothing
#
# Settings (environment, default):
#   NGPUS        processes on this node, one per GPU     (GPUs that nvidia-smi lists, else 1)
#   NNODES       nodes in the job                        (1)
#   NODE_RANK    this node's rank, 0..NNODES-1           (0)
#   MASTER_ADDR  address of node 0, reachable from all   (127.0.0.1)
#   MASTER_PORT  rendezvous port on node 0               (29500; change it to run two jobs at once)
#   LAUNCHER     accelerate | torchrun                   (accelerate)
#   STRATEGY     ddp | fsdp, for accelerate              (ddp: configs/accelerate/ddp.yaml)
#   CONFIG       emoji-rl grpo config file               (configs/gpu/grpo.yaml)
#   TRAIN_GPUS   CUDA_VISIBLE_DEVICES of the trainer     (unset: all; NGPUS then counts only these)
#   PYTHON       interpreter with emoji-rl installed     (.venv/bin/python if present, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
LAUNCHER=${LAUNCHER:-accelerate}
STRATEGY=${STRATEGY:-ddp}
CONFIG=${CONFIG:-configs/gpu/grpo.yaml}
if [[ -z "${NGPUS:-}" ]]; then
  if [[ -n "${TRAIN_GPUS:-}" ]]; then
    IFS=, read -r -a visible <<< "$TRAIN_GPUS"
    NGPUS=${#visible[@]}
  else
    NGPUS=$(count_gpus)
  fi
fi
pick_python

require_int NGPUS "$NGPUS" 1
require_int NNODES "$NNODES" 1
require_int NODE_RANK "$NODE_RANK" 0
(( NODE_RANK < NNODES )) || die "NODE_RANK=$NODE_RANK must be below NNODES=$NNODES"
require_int MASTER_PORT "$MASTER_PORT" 1
require_one_of LAUNCHER "$LAUNCHER" accelerate torchrun
require_one_of STRATEGY "$STRATEGY" ddp fsdp

envs=()
[[ -n "${TRAIN_GPUS:-}" ]] && envs+=("CUDA_VISIBLE_DEVICES=$TRAIN_GPUS")
stage=(-m emoji_rl.cli grpo --config "$CONFIG" ${ARGS[@]+"${ARGS[@]}"})

if [[ "$LAUNCHER" == accelerate ]]; then
  # accelerate counts processes over all nodes.
  cmd=(
    "$PYTHON" -m accelerate.commands.launch
    --config_file "configs/accelerate/$STRATEGY.yaml"
    --num_machines "$NNODES"
    --machine_rank "$NODE_RANK"
    --main_process_ip "$MASTER_ADDR"
    --main_process_port "$MASTER_PORT"
    --num_processes "$((NGPUS * NNODES))"
  )
else
  [[ "$STRATEGY" == ddp ]] || die "STRATEGY=$STRATEGY needs LAUNCHER=accelerate (torchrun runs plain DDP)"
  cmd=(
    "$PYTHON" -m torch.distributed.run
    --nnodes "$NNODES"
    --node_rank "$NODE_RANK"
    --nproc_per_node "$NGPUS"
    --master_addr "$MASTER_ADDR"
    --master_port "$MASTER_PORT"
  )
fi
if [[ ${#envs[@]} -gt 0 ]]; then cmd=(env "${envs[@]}" "${cmd[@]}"); fi
run "${cmd[@]}" "${stage[@]}"
