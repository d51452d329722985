#!/usr/bin/env bash
# Run a command with the vLLM servers it needs up, then stop the servers this script started: a
# pipeline stage (configs/gpu/experiment.yaml) holds the GPUs only while it runs, and SFT, which takes
# every GPU, runs between stages with none. SERVERS is `judge` (a stage that asks the judge) or
# `judge,policy` (GRPO, which also rolls out on the policy server); the policy server
# starts only where the layout has one (POLICY_GPUS; on 2 GPUs GRPO rolls out in the trainer). A
# server that already answers /health is used as it is and left running, so servers started by hand
# (make serve-judge) serve every stage without reloading. The command is told where each server
# listens: `--judge_url URL` (and `--vllm_url URL` for the policy server) go after its arguments, so
# a stage reaches the server this script asked, at JUDGE_HOST:JUDGE_PORT (POLICY_HOST:POLICY_PORT); a
# command that names another URL is refused. The servers run in their own process groups; on exit,
# on SIGTERM (the pipeline runner dying) or on SIGINT they get SIGTERM, then SIGKILL after 30 s.
# Their output goes to SERVER_LOG_DIR/<server>.log.
#
#   launch/with_servers.sh judge -- launch/eval_retrieval.sh --max_examples 64
#   launch/with_servers.sh judge,policy -- launch/train_grpo.sh --resume true
#   launch/with_servers.sh judge --dry-run -- launch/stage.sh rl-prompts   # print every command
#
# Settings (environment, default):
#   SERVER_LOG_DIR  the servers' logs                                  (runs/servers)
#   WAIT_S          seconds to wait for each server to answer /health  (900)
#   JUDGE_HOST, JUDGE_PORT, POLICY_HOST, POLICY_PORT, and every setting of serve_judge.sh and
#                   serve_policy.sh; /health is asked at the bind host (0.0.0.0: 127.0.0.1); the command
#                   sees them too (MAX_OFF_POLICY_STEPS: the policy server's and train_grpo.sh's K)
#   GPUS, JUDGE_GPUS, POLICY_GPUS, TRAIN_GPUS   the layout (below), checked first
#   PYTHON          interpreter with emoji-rl installed                (.venv/bin/python if present, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/common.sh

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  judge|judge,policy) SERVERS=$1; shift ;;
  *) die "usage: launch/with_servers.sh judge|judge,policy [--dry-run] -- COMMAND ... (got '${1:-}')" ;;
esac
DRY_RUN=0
while [[ "${1:-}" == --dry-run || "${1:-}" == -h || "${1:-}" == --help ]]; do
  [[ "$1" == --dry-run ]] || { usage; exit 0; }
  DRY_RUN=1
  shift
done
[[ "${1:-}" == -- && $# -ge 2 ]] || die "usage: launch/with_servers.sh $SERVERS [--dry-run] -- COMMAND ..."
shift
COMMAND=("$@")

SERVER_LOG_DIR=${SERVER_LOG_DIR:-runs/servers}
WAIT_S=${WAIT_S:-900}
require_int WAIT_S "$WAIT_S" 1
gpu_layout  # exported: the servers and the command see the same layout
export JUDGE_PORT=${JUDGE_PORT:-8001} POLICY_PORT=${POLICY_PORT:-8002}
pick_python

wanted=(judge)
[[ "$SERVERS" == judge,policy ]] && has_server POLICY && wanted+=(policy)
url_of() { if [[ "$1" == judge ]]; then server_url JUDGE; else server_url POLICY; fi; }
answers() { "$PYTHON" -m emoji_rl.io.endpoint "$1" --once > /dev/null 2>&1; }

# Where the stage looks for each server: where this script asks for /health. A URL flag of the
# command's own that says otherwise would have the stage wait for a server that is not there.
server_flags "${wanted[@]}"
for ((i = 0; i < ${#COMMAND[@]}; i++)); do
  for ((j = 0; j < ${#SERVER_FLAGS[@]}; j += 2)); do
    name=${SERVER_FLAGS[$j]} url=${SERVER_FLAGS[$((j + 1))]}
    case "${COMMAND[$i]}" in
      "$name") given=${COMMAND[$((i + 1))]:-} ;;
      "$name="*) given=${COMMAND[$i]#*=} ;;
      *) continue ;;
    esac
    [[ "$given" == "$url" ]] \
      || die "the command's $name $given is not where the server listens: this script starts or finds it at $url (the *_HOST and *_PORT settings) and tells the command so; drop the flag, or set the host and port"
  done
done
COMMAND+=("${SERVER_FLAGS[@]}")

if [[ "$DRY_RUN" == 1 ]]; then
  for server in "${wanted[@]}"; do
    echo "# server $server, unless $(url_of "$server") answers: in the background, log in $SERVER_LOG_DIR/$server.log"
    "launch/serve_$server.sh" --dry-run
  done
  echo "# then, with every server answering /health:"
  # The command is a launch script: it prints its own command under --dry-run.
  exec "${COMMAND[@]}" --dry-run
fi

pids=()
command_pid=
stop() {
  local pid
  [[ -z "$command_pid" ]] || kill -TERM "$command_pid" 2>/dev/null || true
  for pid in ${pids[@]+"${pids[@]}"}; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in ${pids[@]+"${pids[@]}"}; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}
trap stop EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

mkdir -p "$SERVER_LOG_DIR"
for server in "${wanted[@]}"; do
  url=$(url_of "$server")
  if answers "$url"; then
    echo "$SCRIPT: $server server already answers at $url: using it" >&2
    continue
  fi
  echo "$SCRIPT: starting the $server server (log: $SERVER_LOG_DIR/$server.log)" >&2
  setsid "launch/serve_$server.sh" > "$SERVER_LOG_DIR/$server.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  start=$SECONDS
  until answers "$url"; do
    kill -0 "$pid" 2>/dev/null || die "the $server server exited before answering $url/health: see $SERVER_LOG_DIR/$server.log"
    (( SECONDS - start < WAIT_S )) || die "the $server server gave no answer at $url/health within WAIT_S=$WAIT_S s: see $SERVER_LOG_DIR/$server.log"
    sleep 5
  done
done

# In the background and waited for: bash runs a trap only between commands, so a foreground command
# would keep the servers up until it ended.
"${COMMAND[@]}" &
command_pid=$!
set +e
wait "$command_pid"
status=$?
command_pid=
exit "$status"
