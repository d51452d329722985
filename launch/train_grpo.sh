#!/usr/bin/env bash
# Multi-turn GRPO on TRAIN_GPUS, one process per GPU, over NNODES nodes, with `accelerate launch`
# (default) or `torchrun`. Each process rolls out its share of the batch and gradients are
# all-reduced. Start launch/serve_judge.sh and launch/serve_policy.sh first: the layout below gives
# them other GPUs. A layout without a policy server (2 GPUs) rolls out in the trainer's processes:
# this script then passes `--engine hf --max_off_policy_steps 0` (on one node). Extra arguments go to `emoji-rl grpo` and win
# over the config file.
#
#   launch/train_grpo.sh                                       # TRAIN_GPUS, configs/gpu/grpo.yaml
#   GPUS=4 launch/train_grpo.sh --max_steps 2                  # GPU 3; 0-2 serve the judge and policy
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 launch/train_grpo.sh   # on node 0, beside the servers
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 JUDGE_GPUS= POLICY_GPUS= TRAIN_GPUS=0,1,2,3 \
#     launch/train_grpo.sh --judge_url http://10.0.0.1:8001 --vllm_url http://10.0.0.1:8002   # node 1
#   LAUNCHER=torchrun launch/train_grpo.sh
#   MAX_OFF_POLICY_STEPS=2 launch/train_grpo.sh                # with serve_policy.sh started so too
#   GPUS=0 CONFIG=configs/cpu/grpo.yaml launch/train_grpo.sh --engine vllm   # no GPU: one CPU process
#   GPUS=0 NNODES=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 launch/train_grpo.sh --engine hf   # no GPU: a gloo process a node
#   launch/train_grpo.sh --dry-run                             # print the command, run nothing
#
# Settings (environment, default):
#   GPUS         the box's GPU count: picks the layout   (what nvidia-smi lists, else 1)
#   TRAIN_GPUS   CUDA_VISIBLE_DEVICES of the trainer     (the layout's: 1 on 2 GPUs, 3 on 4, 4,5,6,7 on 8)
#   NGPUS        processes on this node                  (the number of TRAIN_GPUS; set, it must match;
#                with GPUS=0, CPU processes over gloo: 1). Every node must run as many.
#   NNODES       nodes in the job                        (1)
#   NODE_RANK    this node's rank, 0..NNODES-1           (0)
#   MASTER_ADDR  address of node 0, reachable from all   (127.0.0.1 on one node; NNODES > 1 needs it set,
#                not to a loopback address unless GPUS=0)
#   MASTER_PORT  rendezvous port on node 0               (29500; change it to run two jobs at once)
#   LAUNCHER     accelerate | torchrun                   (accelerate)
#   STRATEGY     ddp | fsdp, for accelerate              (ddp: configs/accelerate/ddp.yaml)
#   CONFIG       emoji-rl grpo config file               (configs/gpu/grpo.yaml)
#   MAX_OFF_POLICY_STEPS  K, passed as --max_off_policy_steps (before the extra arguments): rollouts
#                sample with adapters up to K updates old      (unset: the config file's value, 1 in
#                configs/gpu/grpo.yaml). Give launch/serve_policy.sh the same: it holds K+1 adapter
#                versions (--max-loras) and assumes K=1 when unset. Set, an explicit
#                --max_off_policy_steps other than K is refused.
#   JUDGE_GPUS, POLICY_GPUS  checked: none may share a GPU with TRAIN_GPUS; POLICY_GPUS empty = --engine hf
#   PYTHON       interpreter with emoji-rl installed     (.venv/bin/python if present, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"

CONFIG=${CONFIG:-configs/gpu/grpo.yaml}
pick_python
gpu_layout
on_cpu || [[ -n "$TRAIN_GPUS" ]] || die "TRAIN_GPUS is empty: the trainer needs at least one GPU"
node_settings

stage=(-m emoji_rl.cli grpo --config "$CONFIG")
# The policy server was sized for MAX_OFF_POLICY_STEPS (--max-loras K+1): a flag that says otherwise
# would have the trainer sample with more adapter versions than the server batches at once.
if [[ -n "${MAX_OFF_POLICY_STEPS:-}" ]]; then
  require_int MAX_OFF_POLICY_STEPS "$MAX_OFF_POLICY_STEPS" 0
  for ((i = 0; i < ${#ARGS[@]}; i++)); do
    case "${ARGS[$i]}" in
      --max_off_policy_steps) value=${ARGS[$((i + 1))]:-} ;;
      --max_off_policy_steps=*) value=${ARGS[$i]#*=} ;;
      *) continue ;;
    esac
    [[ "$value" =~ ^[0-9]+$ ]] || die "--max_off_policy_steps '$value' must be an integer >= 0"
    (( 10#$value == 10#$MAX_OFF_POLICY_STEPS )) \
      || die "--max_off_policy_steps $value disagrees with MAX_OFF_POLICY_STEPS=$MAX_OFF_POLICY_STEPS: the policy server holds MAX_OFF_POLICY_STEPS+1 adapter versions (--max-loras), and this trainer would sample with $((10#$value + 1)); set MAX_OFF_POLICY_STEPS=$value for launch/serve_policy.sh and this script both, and drop the flag"
  done
  # Before ARGS, as --engine below.
  stage+=(--max_off_policy_steps "$MAX_OFF_POLICY_STEPS")
fi
# Before ARGS, so an explicit --engine still wins. Only on one node: another node's layout has no
# policy server of its own, yet the job's rollouts may use node 0's. In-process rollouts use the
# weights being trained, so they never run ahead of them (after any K above: the last flag wins).
! has_server POLICY && [[ "$NNODES" == 1 ]] && stage+=(--engine hf --max_off_policy_steps 0)
stage+=(${ARGS[@]+"${ARGS[@]}"})

if on_cpu; then
  # Without GPUs: NGPUS processes per node on the CPU (gloo), beside the servers; one is started
  # without a launcher. OpenMP waits passively, as the servers' (common.sh) do on the shared cores.
  NGPUS=${NGPUS:-1}
  require_int NGPUS "$NGPUS" 1
  (( NGPUS * NNODES > 1 )) || run env CUDA_VISIBLE_DEVICES= OMP_WAIT_POLICY=PASSIVE "$PYTHON" "${stage[@]}"
  launcher "$NGPUS"
  run env CUDA_VISIBLE_DEVICES= OMP_WAIT_POLICY=PASSIVE "${LAUNCH[@]}" "${stage[@]}"
fi
check_ngpus "$TRAIN_GPUS" "TRAIN_GPUS=$TRAIN_GPUS"
require_free_gpus "$TRAIN_GPUS"
launcher "$(count_list "$TRAIN_GPUS")"
run env "CUDA_VISIBLE_DEVICES=$TRAIN_GPUS" "${LAUNCH[@]}" "${stage[@]}"
