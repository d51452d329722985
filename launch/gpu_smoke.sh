#!/usr/bin/env bash
# GPU smoke test, for a box with GPUs (GPUS=0 runs it on vLLM's CPU engine, as the test suite does
# with the cpu profile's configs), on the GPU layout below: starts the
# judge vLLM server and, where the layout has one, the policy server, waits for them, runs two GRPO
# steps with the openai judge (the vllm engine, or --engine hf without a policy server), then one
# retrieval evaluation, and reports PASS / FAIL / SKIP per stage (budget: 15 minutes). On GPUs with a
# policy server a last stage, sampling, measures that server's tokens/s with and without the
# rollouts' per-request seed and padding logit_bias (python -m emoji_rl.bench.sampling) and the
# summary prints its figures; then prefix-cache plays 32 five-turn episodes shaped like the
# retrieval game's against it and prints the share of their prompt tokens the server read from its
# prefix cache, and the block size it settled on (python -m emoji_rl.bench.prefix_cache; Qwen3.5's
# blocks are 528 to 640 tokens, docs/VLLM.md §9). Servers are stopped on exit; every stage's output is
# in SMOKE_DIR/<stage>.log. It needs no data and no SFT run: GRPO starts from a fresh adapter and plays
# the sample targets of data/samples/rl_eval.jsonl, which the evaluation plays too. It tests servers it
# starts itself: a server already answering at JUDGE_PORT or POLICY_PORT fails its stage at once.
#
#   launch/gpu_smoke.sh                              # this box's layout (GPUS: what nvidia-smi lists)
#   GPUS=2 launch/gpu_smoke.sh                       # judge 0 (TP 1), trainer 1 with --engine hf
#   launch/gpu_smoke.sh --dry-run                    # print every command, run nothing
#   GPUS=0 GRPO_CONFIG=configs/cpu/grpo.yaml EVAL_CONFIG=configs/cpu/eval_retrieval.yaml launch/gpu_smoke.sh
#
# Settings (environment, default):
#   SMOKE_DIR    logs, run directories, summary.txt (emptied first)    (runs/gpu-smoke)
#   GPUS, JUDGE_GPUS, POLICY_GPUS, TRAIN_GPUS, JUDGE_TP, ...   the layout (below), checked first
#   WAIT_S       seconds to wait for each server to answer /health      (900)
#   SMOKE_EXAMPLES  held-out targets the evaluation plays               (16)
#   GRPO_CONFIG  config of the two GRPO steps                           (configs/gpu/grpo.yaml)
#   EVAL_CONFIG  config of the evaluation                               (configs/gpu/eval_retrieval.yaml)
#   PYTHON       interpreter with emoji-rl installed                    (.venv/bin/python if present, else python3)
#   and every setting of serve_judge.sh, serve_policy.sh, train_grpo.sh and eval_retrieval.sh
#   (JUDGE_MODEL, POLICY_MODEL, JUDGE_PORT, POLICY_PORT, JUDGE_NAME, POLICY_NAME, *_API_KEY, ...;
#   MAX_OFF_POLICY_STEPS reaches the policy server and the GRPO stage alike).
set -uo pipefail  # not -e: a failed stage is recorded and the summary still printed
cd "$(dirname "$0")/.."
source launch/common.sh
parse_args "$@"
[[ ${#ARGS[@]} -eq 0 ]] || die "unexpected arguments: ${ARGS[*]} (settings come from the environment)"

SMOKE_DIR=${SMOKE_DIR:-runs/gpu-smoke}
WAIT_S=${WAIT_S:-900}
SMOKE_EXAMPLES=${SMOKE_EXAMPLES:-16}
GRPO_CONFIG=${GRPO_CONFIG:-configs/gpu/grpo.yaml}
EVAL_CONFIG=${EVAL_CONFIG:-configs/gpu/eval_retrieval.yaml}
gpu_layout  # exported: the scripts below see the same layout
has_server JUDGE || die "the $GPU_LAYOUT-GPU layout (GPUS=$GPUS) has no GPU for the judge server the smoke test starts: set JUDGE_GPUS"
on_cpu || [[ -n "$TRAIN_GPUS" ]] || die "TRAIN_GPUS is empty: the GRPO and eval stages need a GPU"
export JUDGE_PORT=${JUDGE_PORT:-8001} POLICY_PORT=${POLICY_PORT:-8002}
export JUDGE_NAME=${JUDGE_NAME:-judge} POLICY_NAME=${POLICY_NAME:-policy}
pick_python
require_int WAIT_S "$WAIT_S" 1
require_int SMOKE_EXAMPLES "$SMOKE_EXAMPLES" 1

judge_url=$(server_url JUDGE)
policy_url=$(server_url POLICY)
POLL_S=5  # how often a dead server is noticed while waiting
SAMPLES=data/samples/rl_eval.jsonl  # in the repository: a fresh box has no data of its own yet
# The trainer reads the keys from the same variables the servers were started with. For an openai
# judge, judge_model is the name the server serves.
server_flags judge
judge_flags=(
  --judge openai "${SERVER_FLAGS[@]}" --judge_model "$JUDGE_NAME" --judge_api_key_env JUDGE_API_KEY
)
servers=(judge-server)
grpo_args=(
  --max_steps 2 --save_steps 2 --output_dir "$SMOKE_DIR/grpo" --init_adapter none --train_data "$SAMPLES"
  --eval_data "$SAMPLES" "${judge_flags[@]}"
)
if has_server POLICY; then
  servers+=(policy-server)
  server_flags policy
  grpo_args+=(
    --engine vllm "${SERVER_FLAGS[@]}" --vllm_served_name "$POLICY_NAME" --vllm_api_key_env POLICY_API_KEY
  )
fi  # else train_grpo.sh passes --engine hf: rollouts in the trainer's process
eval_args=(
  --systems base "rl=$SMOKE_DIR/grpo/adapter" --data "$SAMPLES" --max_examples "$SMOKE_EXAMPLES"
  --output_dir "$SMOKE_DIR/eval" "${judge_flags[@]}"
)
wait_cmd() { print_cmd "$PYTHON" -m emoji_rl.io.endpoint "$1" --once; }
# What the rollouts' per-request seed and padding bias cost the policy server: GPU figures, which no
# CPU can give (make bench has the CPU engine's).
sampling_cmd=()
if has_server POLICY && ! on_cpu; then
  sampling_cmd=("$PYTHON" -m emoji_rl.bench.sampling --url "$policy_url" --model "$POLICY_NAME" --api_key_env POLICY_API_KEY)
fi

# The policy server's prefix-cache hit rate on multi-turn episodes and its block size: which kernels
# a GPU runs decides the block of a hybrid model, so only a GPU gives them (make bench has the CPU's).
prefix_cmd=()
if has_server POLICY && ! on_cpu; then
  prefix_cmd=("$PYTHON" -m emoji_rl.bench.prefix_cache --url "$policy_url" --model "$POLICY_NAME" --api_key_env POLICY_API_KEY)
fi

if [[ "$DRY_RUN" == 1 ]]; then
  echo "# stage judge-server: in the background, log in $SMOKE_DIR/judge-server.log"
  launch/serve_judge.sh --dry-run
  if has_server POLICY; then
    echo "# stage policy-server: in the background, log in $SMOKE_DIR/policy-server.log"
    launch/serve_policy.sh --dry-run
  fi
  echo "# each server stage then repeats this every POLL_S=$POLL_S s while its server lives, up to WAIT_S=$WAIT_S s:"
  wait_cmd "$judge_url"
  ! has_server POLICY || wait_cmd "$policy_url"
  echo "# stage grpo: log in $SMOKE_DIR/grpo.log"
  CONFIG="$GRPO_CONFIG" launch/train_grpo.sh --dry-run "${grpo_args[@]}"
  echo "# stage eval: log in $SMOKE_DIR/eval.log"
  CONFIG="$EVAL_CONFIG" launch/eval_retrieval.sh --dry-run "${eval_args[@]}"
  if [[ ${#sampling_cmd[@]} -gt 0 ]]; then
    echo "# stage sampling: log in $SMOKE_DIR/sampling.log"
    print_cmd "${sampling_cmd[@]}"
  fi
  if [[ ${#prefix_cmd[@]} -gt 0 ]]; then
    echo "# stage prefix-cache: log in $SMOKE_DIR/prefix-cache.log"
    print_cmd "${prefix_cmd[@]}"
  fi
  exit 0
fi

rm -rf "$SMOKE_DIR"
mkdir -p "$SMOKE_DIR"
stages=("${servers[@]}" grpo eval)
[[ ${#sampling_cmd[@]} -eq 0 ]] || stages+=(sampling)
[[ ${#prefix_cmd[@]} -eq 0 ]] || stages+=(prefix-cache)
declare -A result=() took=()
pids=()

stop_servers() {
  local pid
  for pid in ${pids[@]+"${pids[@]}"}; do
    # Each server runs in its own process group (setsid): TERM reaches vLLM's engine workers too.
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  for pid in ${pids[@]+"${pids[@]}"}; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}
trap stop_servers EXIT

start_server() {  # NAME SCRIPT URL
  # A server already there would answer /health for the one started here, which then dies on the
  # taken port: its stage would pass on a server it never started.
  if "$PYTHON" -m emoji_rl.io.endpoint "$3" --once > /dev/null 2>&1; then
    echo "a server already answers at $3: gpu_smoke.sh tests servers it starts itself; stop that one, or give this run another port (JUDGE_PORT, POLICY_PORT)" | tee "$SMOKE_DIR/$1.log" >&2
    result[$1]=FAIL; took[$1]=0
    return 1
  fi
  setsid "$2" > "$SMOKE_DIR/$1.log" 2>&1 &
  pids+=($!)
}

wait_ready() {  # NAME URL PID
  [[ -z "${result[$1]:-}" ]] || return 0  # not started: its stage failed already
  local start=$SECONDS
  while (( SECONDS - start < WAIT_S )); do
    if ! kill -0 "$3" 2>/dev/null; then
      echo "server exited before answering $2/health" >> "$SMOKE_DIR/$1.log"
      result[$1]=FAIL; took[$1]=$((SECONDS - start)); return
    fi
    if "$PYTHON" -m emoji_rl.io.endpoint "$2" --once > /dev/null 2>&1; then
      result[$1]=PASS; took[$1]=$((SECONDS - start)); return
    fi
    sleep "$POLL_S"
  done
  echo "no answer at $2/health within WAIT_S=$WAIT_S s" >> "$SMOKE_DIR/$1.log"
  result[$1]=FAIL; took[$1]=$((SECONDS - start))
}

run_stage() {  # NAME COMMAND...
  local name=$1 start=$SECONDS
  shift
  if "$@" > "$SMOKE_DIR/$name.log" 2>&1; then result[$name]=PASS; else result[$name]=FAIL; fi
  took[$name]=$((SECONDS - start))
}

total=$SECONDS
start_server judge-server launch/serve_judge.sh "$judge_url" && judge_pid=${pids[-1]}
! has_server POLICY || { start_server policy-server launch/serve_policy.sh "$policy_url" && policy_pid=${pids[-1]}; }
wait_ready judge-server "$judge_url" "${judge_pid:-}"
! has_server POLICY || wait_ready policy-server "$policy_url" "${policy_pid:-}"
servers_up=1
for stage in "${servers[@]}"; do [[ "${result[$stage]}" == PASS ]] || servers_up=0; done
if [[ "$servers_up" == 1 ]]; then
  run_stage grpo env CONFIG="$GRPO_CONFIG" launch/train_grpo.sh "${grpo_args[@]}"
fi
if [[ "${result[grpo]:-}" == PASS ]]; then
  run_stage eval env CONFIG="$EVAL_CONFIG" launch/eval_retrieval.sh "${eval_args[@]}"
fi
if [[ "$servers_up" == 1 && ${#sampling_cmd[@]} -gt 0 ]]; then
  run_stage sampling "${sampling_cmd[@]}"
fi
if [[ "$servers_up" == 1 && ${#prefix_cmd[@]} -gt 0 ]]; then
  run_stage prefix-cache "${prefix_cmd[@]}"
fi

failed=0
elapsed=$((SECONDS - total))
summary=$(printf '%-14s %-6s %s\n' stage result seconds)
for stage in "${stages[@]}"; do
  summary+=$'\n'$(printf '%-14s %-6s %s' "$stage" "${result[$stage]:-SKIP}" "${took[$stage]:--}")
  [[ "${result[$stage]:-SKIP}" == PASS ]] || failed=1
done
# The sampling stage's table: seeded / plain and biased / plain tokens/s, for the first GPU run.
[[ "${result[sampling]:-}" != PASS ]] || summary+=$'\n'$(sed -n '/^benchmark /,$p' "$SMOKE_DIR/sampling.log")
# The prefix-cache stage's block size, per-turn table and hit rate.
[[ "${result[prefix-cache]:-}" != PASS ]] || summary+=$'\n'$(sed -n '/^prefix cache, /,$p' "$SMOKE_DIR/prefix-cache.log")
(( elapsed <= 900 )) || summary+=$'\n'"slow: $elapsed s, over the 15-minute budget"
if [[ "$failed" == 0 ]]; then
  summary+=$'\n'"gpu_smoke: PASS in $elapsed s"
else
  summary+=$'\n'"gpu_smoke: FAIL; logs in $SMOKE_DIR"
fi
echo "$summary" | tee "$SMOKE_DIR/summary.txt"
exit "$failed"
