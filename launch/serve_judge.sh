#!/usr/bin/env bash
# Serve the frozen judge LLM with vLLM (OpenAI-compatible) for the `openai` judge (docs/DESIGN.md §4).
# Thinking is turned off per request by the client (chat_template_kwargs enable_thinking=false), so
# no --reasoning-parser; --generation-config vllm keeps the model's sampling defaults out, so the
# client's temperature and token limit are the only ones applied. Extra arguments go to `vllm serve`.
#
#   launch/serve_judge.sh                          # Qwen3-30B-A3B-Instruct-2507 on 127.0.0.1:8001, JUDGE_GPUS
#   JUDGE_DP=2 launch/serve_judge.sh                # two data-parallel replicas, one GPU each
#   GPUS=4 JUDGE_API_KEY=secret launch/serve_judge.sh
#   launch/serve_judge.sh --max-num-seqs 512        # any other `vllm serve` flag
#   launch/serve_judge.sh --dry-run                 # print the command, run nothing
#   GPUS=0 launch/serve_judge.sh                    # no GPU: the cpu profile's SmolLM2 on vLLM's CPU engine
#
# Settings (environment, default):
#   JUDGE_MODEL          hub id, local directory or embedded:NAME (Qwen/Qwen3-30B-A3B-Instruct-2507;
#                        GPUS=0: embedded:smollm2-135m-instruct)
#   JUDGE_NAME           served model name the trainer sends  (judge)
#   JUDGE_HOST           bind address                         (127.0.0.1; 0.0.0.0 exposes it to the network)
#   JUDGE_PORT           port                                 (8001)
#   GPUS                 the box's GPU count: picks the layout (what nvidia-smi lists, else 1)
#   JUDGE_GPUS           CUDA_VISIBLE_DEVICES of the server   (the layout's: 0 on 2 GPUs, 0,1 on 4 and 8)
#   JUDGE_TP             tensor-parallel size                 (JUDGE_GPUS / JUDGE_DP: ~61 GB of bf16 weights)
#   JUDGE_DP             data-parallel replicas               (1)
#   JUDGE_EP             1 = expert parallelism for the MoE layers instead of TP (0)
#   POLICY_GPUS, TRAIN_GPUS  checked: none may share a GPU with JUDGE_GPUS
#   JUDGE_MAX_MODEL_LEN  context length in tokens             (8192; a 5-turn judge chat is under 1K)
#   JUDGE_GPU_MEMORY     --gpu-memory-utilization, in (0, 1]  (0.90)
#   JUDGE_API_KEY        key the server requires              (unset: none); passed as VLLM_API_KEY, never printed
#   VLLM                 the vllm executable                  (.venv-vllm/bin/vllm if present, else vllm;
#                        GPUS=0: .venv-vllm-engine/bin/vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"

JUDGE_NAME=${JUDGE_NAME:-judge}
JUDGE_HOST=${JUDGE_HOST:-127.0.0.1}
JUDGE_PORT=${JUDGE_PORT:-8001}
JUDGE_EP=${JUDGE_EP:-0}
JUDGE_MAX_MODEL_LEN=${JUDGE_MAX_MODEL_LEN:-8192}
JUDGE_GPU_MEMORY=${JUDGE_GPU_MEMORY:-0.90}
gpu_layout
pick_vllm
if on_cpu; then JUDGE_MODEL=${JUDGE_MODEL:-embedded:smollm2-135m-instruct}; fi
JUDGE_MODEL=$(resolve_model "${JUDGE_MODEL:-Qwen/Qwen3-30B-A3B-Instruct-2507}")
has_server JUDGE || die "the $GPU_LAYOUT-GPU layout (GPUS=$GPUS) has no GPU for the judge: set JUDGE_GPUS to GPUs the trainer does not use, or serve the judge elsewhere (the stages' --judge_url)"

require_int JUDGE_PORT "$JUDGE_PORT" 1
require_one_of JUDGE_EP "$JUDGE_EP" 0 1

# The key goes through the environment: on the command line `ps` would show it to every user.
[[ -n "${JUDGE_API_KEY:-}" ]] && export VLLM_API_KEY="$JUDGE_API_KEY"

server_device JUDGE
cmd=(
  env "${DEVICE_ENV[@]}" "$VLLM" serve "$JUDGE_MODEL"
  --host "$JUDGE_HOST"
  --port "$JUDGE_PORT"
  --served-model-name "$JUDGE_NAME"
  "${DEVICE_FLAGS[@]}"
)
[[ "$JUDGE_EP" == 1 ]] && cmd+=(--enable-expert-parallel)
cmd+=(
  --max-model-len "$JUDGE_MAX_MODEL_LEN"
  --generation-config vllm
  ${ARGS[@]+"${ARGS[@]}"}
)
run "${cmd[@]}"
