#!/usr/bin/env bash
# Serve the sender's base model with vLLM for the `vllm` rollout engine: runtime LoRA loading (the
# trainer loads each new adapter as POLICY_NAME-<session>-v<step>), the emoji grammar through
# xgrammar structured outputs, and log-probs of the distribution actually sampled from
# (processed_logprobs: the trainer's importance weights compare them with its own masked,
# temperature-scaled log-probs).
# No --reasoning-parser: with one, the grammar would not apply until reasoning ends.
# --language-model-only: Qwen3.5 is a vision-language model; vLLM 0.33 then builds its vision tower
# as a placeholder and loads no weights for it (the rollouts are text). One API server process even
# with data parallel: each API process keeps its own table of runtime-loaded adapters (vLLM refuses
# VLLM_ALLOW_RUNTIME_LORA_UPDATING with more than one, and would default to one per replica).
# Extra arguments go to `vllm serve`.
#
#   launch/serve_policy.sh                          # Qwen3.5-4B on 127.0.0.1:8002, POLICY_GPUS
#   GPUS=8 POLICY_MAX_LORA_RANK=64 launch/serve_policy.sh
#   MAX_OFF_POLICY_STEPS=3 launch/serve_policy.sh   # for a trainer 3 updates behind: --max-loras 4
#   launch/serve_policy.sh --dry-run                # print the command, run nothing
#   GPUS=0 launch/serve_policy.sh                   # no GPU: the cpu profile's SmolLM2 on vLLM's CPU engine
#
# Settings (environment, default):
#   POLICY_MODEL          base model: the grpo config's `model`     (Qwen/Qwen3.5-4B;
#                         GPUS=0: embedded:smollm2-135m-instruct)
#   POLICY_NAME           served base name; adapters load as NAME-<session>-v<step> (policy)
#   POLICY_HOST           bind address                              (127.0.0.1)
#   POLICY_PORT           port                                      (8002)
#   GPUS                  the box's GPU count: picks the layout     (what nvidia-smi lists, else 1)
#   POLICY_GPUS           CUDA_VISIBLE_DEVICES of the server        (the layout's: 2 on 4 GPUs, 2,3 on 8; none on 2)
#   POLICY_TP             tensor-parallel size                      (1)
#   POLICY_DP             data-parallel replicas                    (POLICY_GPUS / POLICY_TP)
#   JUDGE_GPUS, TRAIN_GPUS  checked: none may share a GPU with POLICY_GPUS
#   POLICY_MAX_LORA_RANK  >= the adapter's lora_r: 8 16 32 64 128 256 320 512 (32, the gpu lora_r)
#   MAX_OFF_POLICY_STEPS  the trainer's max_off_policy_steps K: its rollouts sample with adapters
#                         up to K updates old, so up to K+1 versions are in use at once
#                         (1, the gpu profile's; launch/train_grpo.sh passes the same value on)
#   POLICY_MAX_LORAS      adapters in one batch, >= K+1: vLLM batches at most this many adapters and
#                         holds a further version's requests back until one finishes (max(2, K+1))
#   POLICY_MAX_CPU_LORAS  adapters cached in CPU memory, >= POLICY_MAX_LORAS and >= the trainer's
#                         vllm_adapter_keep (>= K+1); unloading does not evict, LRU does
#                         (max(4, K+2, POLICY_MAX_LORAS): the kept versions and the one being published)
#   POLICY_MAX_MODEL_LEN  context length: a whole episode           (4096; 5 turns stay under 1.5K)
#   POLICY_GPU_MEMORY     --gpu-memory-utilization, in (0, 1]       (0.90)
#   POLICY_PREFIX_MATCH_UNIT  a hybrid model's --prefix-match-unit: its prefix-cache hits land on
#                         multiples of this many tokens, not on whole blocks, which vLLM makes as
#                         large as a linear-attention state (528 to 640 tokens for Qwen3.5-4B, longer
#                         than most turns: docs/VLLM.md §9); empty: whole blocks
#                         (16 for a hybrid model on GPUs; empty otherwise and on the CPU layout)
#   POLICY_API_KEY        key the server requires                   (unset: none); passed as VLLM_API_KEY, never printed
#   VLLM                  the vllm executable                       (.venv-vllm/bin/vllm if present, else vllm;
#                         GPUS=0: .venv-vllm-engine/bin/vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"

POLICY_NAME=${POLICY_NAME:-policy}
POLICY_HOST=${POLICY_HOST:-127.0.0.1}
POLICY_PORT=${POLICY_PORT:-8002}
POLICY_MAX_LORA_RANK=${POLICY_MAX_LORA_RANK:-32}
MAX_OFF_POLICY_STEPS=${MAX_OFF_POLICY_STEPS:-1}
require_int MAX_OFF_POLICY_STEPS "$MAX_OFF_POLICY_STEPS" 0
in_use=$((10#$MAX_OFF_POLICY_STEPS + 1))  # adapter versions the trainer may sample with at once
POLICY_MAX_LORAS=${POLICY_MAX_LORAS:-$(( in_use > 2 ? in_use : 2 ))}
# The CPU cache holds the versions the trainer keeps plus the one being published: /v1/unload_lora_adapter
# only drops the name, the worker's LRU cache keeps the adapter until a newer one evicts it (an evicted
# adapter still in use is re-read from its directory, which the trainer keeps as long).
if [[ -z "${POLICY_MAX_CPU_LORAS:-}" ]]; then
  POLICY_MAX_CPU_LORAS=$(( in_use + 1 > 4 ? in_use + 1 : 4 ))
  # Not below an explicit POLICY_MAX_LORAS, which vLLM would refuse (checked below when set).
  [[ "$POLICY_MAX_LORAS" =~ ^[0-9]+$ ]] && (( 10#$POLICY_MAX_LORAS > POLICY_MAX_CPU_LORAS )) \
    && POLICY_MAX_CPU_LORAS=$((10#$POLICY_MAX_LORAS))
fi
POLICY_MAX_MODEL_LEN=${POLICY_MAX_MODEL_LEN:-4096}
POLICY_GPU_MEMORY=${POLICY_GPU_MEMORY:-0.90}
gpu_layout
pick_vllm
if on_cpu; then POLICY_MODEL=${POLICY_MODEL:-embedded:smollm2-135m-instruct}; fi
POLICY_MODEL=$(resolve_model "${POLICY_MODEL:-Qwen/Qwen3.5-4B}")
# Whether the model mixes attention with linear attention, whose blocks vLLM sizes to a recurrent
# state: Qwen3.5 by its hub name, or a directory whose config.json has linear_attention layers.
is_hybrid() {  # MODEL
  if [[ -f "$1/config.json" ]]; then
    grep -q '"linear_attention"' "$1/config.json"
  else
    local name=${1,,}
    [[ "$name" == *qwen3.5* || "$name" == *qwen3_5* ]]
  fi
}
# 16 divides every block vLLM 0.33 picks for Qwen3.5-4B on a GPU, which the unit must; the CPU
# engine fails a seeded request (every rollout's) whose prefill it splits, and it splits each
# prompt at its last checkpoint when the unit is set.
if [[ -z "${POLICY_PREFIX_MATCH_UNIT+set}" ]]; then
  POLICY_PREFIX_MATCH_UNIT=
  if ! on_cpu && is_hybrid "$POLICY_MODEL"; then POLICY_PREFIX_MATCH_UNIT=16; fi
fi
prefix_flags=()
if [[ -n "$POLICY_PREFIX_MATCH_UNIT" ]]; then
  require_int POLICY_PREFIX_MATCH_UNIT "$POLICY_PREFIX_MATCH_UNIT" 1
  is_hybrid "$POLICY_MODEL" \
    || die "POLICY_PREFIX_MATCH_UNIT=$POLICY_PREFIX_MATCH_UNIT is for a hybrid model (Qwen3.5); vLLM refuses it for $POLICY_MODEL, whose hits land on whole blocks: unset it"
  prefix_flags=(--prefix-match-unit "$POLICY_PREFIX_MATCH_UNIT")
fi
has_server POLICY || die "the $GPU_LAYOUT-GPU layout (GPUS=$GPUS) has no policy server: GRPO rolls out in the trainer's process (--engine hf, which launch/train_grpo.sh passes); to serve the policy anyway, set POLICY_GPUS to GPUs the judge and the trainer do not use"

require_int POLICY_PORT "$POLICY_PORT" 1
require_one_of POLICY_MAX_LORA_RANK "$POLICY_MAX_LORA_RANK" 1 8 16 32 64 128 256 320 512
require_int POLICY_MAX_LORAS "$POLICY_MAX_LORAS" 1
(( 10#$POLICY_MAX_LORAS >= in_use )) \
  || die "POLICY_MAX_LORAS=$POLICY_MAX_LORAS is below MAX_OFF_POLICY_STEPS+1 = $in_use: a trainer with max_off_policy_steps=$MAX_OFF_POLICY_STEPS samples with up to $in_use adapter versions at once, and vLLM batches at most --max-loras of them (the others' requests wait); set POLICY_MAX_LORAS >= $in_use, or lower MAX_OFF_POLICY_STEPS for this script and launch/train_grpo.sh both"
require_int POLICY_MAX_CPU_LORAS "$POLICY_MAX_CPU_LORAS" "$POLICY_MAX_LORAS"

# The key goes through the environment: on the command line `ps` would show it to every user.
[[ -n "${POLICY_API_KEY:-}" ]] && export VLLM_API_KEY="$POLICY_API_KEY"

server_device POLICY
cmd=(
  env VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 "${DEVICE_ENV[@]}" "$VLLM" serve "$POLICY_MODEL"
  --host "$POLICY_HOST"
  --port "$POLICY_PORT"
  --served-model-name "$POLICY_NAME"
  "${DEVICE_FLAGS[@]}"
  --api-server-count 1
  --language-model-only
  --enable-lora
  --max-lora-rank "$POLICY_MAX_LORA_RANK"
  --max-loras "$POLICY_MAX_LORAS"
  --max-cpu-loras "$POLICY_MAX_CPU_LORAS"
  --structured-outputs-config.backend xgrammar
  --logprobs-mode processed_logprobs
  --max-model-len "$POLICY_MAX_MODEL_LEN"
  --generation-config vllm
  ${prefix_flags[@]+"${prefix_flags[@]}"}
  ${ARGS[@]+"${ARGS[@]}"}
)
run "${cmd[@]}"
