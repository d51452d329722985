# Sourced by the launch scripts, from the repository root. Conventions (those of train_sft.sh):
# settings come from environment variables documented in each script's header comment, which
# --help prints; --dry-run prints the exact command(s), shell-quoted, and runs nothing; every other
# argument is passed on to the program the script starts.

SCRIPT=$(basename "$0")

die() {
  echo "$SCRIPT: $*" >&2
  exit 2
}

usage() {
  # The header comment: every line after the shebang up to the first line that is not a comment.
  sed -n '2,/^[^#]/p' "launch/$SCRIPT" | sed -e '/^[^#]/d' -e 's/^# \{0,1\}//'
  # Then the GPU layout every script here shares, from its comment below.
  echo
  sed -n '/^# >>> GPU layout/,/^# <<< GPU layout/p' launch/common.sh | sed -e '1d' -e '$d' -e 's/^# \{0,1\}//'
}

# Sets DRY_RUN (0|1) and ARGS (the arguments to pass on).
parse_args() {
  DRY_RUN=0
  ARGS=()
  local arg
  for arg in "$@"; do
    case "$arg" in
      --dry-run) DRY_RUN=1 ;;
      -h|--help) usage; exit 0 ;;
      *) ARGS+=("$arg") ;;
    esac
  done
}

pick_python() {
  if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
  fi
}

# vLLM 0.33 pins torch 2.14 and transformers < 5.21, which the trainer's environment cannot hold:
# it lives in its own venv (make setup-vllm; on the CPU layout, the engine make setup-vllm-engine
# builds) and talks to the trainer over HTTP only.
pick_vllm() {
  if [[ -z "${VLLM:-}" ]]; then
    local venv=.venv-vllm
    on_cpu && venv=.venv-vllm-engine
    if [[ -x $venv/bin/vllm ]]; then VLLM=$venv/bin/vllm; else VLLM=vllm; fi
  fi
}

# A model spec as vLLM takes it: `embedded:NAME` (the cpu profile's models) becomes the directory
# emoji-rl keeps it in; a hub id or a directory is left as it is.
resolve_model() {  # SPEC
  if [[ "$1" == embedded:* ]]; then
    pick_python
    "$PYTHON" -c 'import sys; from emoji_rl.lm import models; print(models.resolve(sys.argv[1]))' "$1" \
      || die "cannot resolve $1 with $PYTHON: is emoji-rl installed there (make setup)?"
  else
    echo "$1"
  fi
}

count_gpus() {
  local n
  n=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
  if [[ "$n" -ge 1 ]]; then echo "$n"; else echo 1; fi
}

require_int() {  # NAME VALUE MIN
  [[ "$2" =~ ^[0-9]+$ && "$2" -ge "$3" ]] || die "$1=$2 must be an integer >= $3"
}

require_one_of() {  # NAME VALUE CHOICE...
  local name=$1 value=$2 choice
  shift 2
  for choice in "$@"; do [[ "$value" == "$choice" ]] && return 0; done
  die "$name=$value must be one of: $*"
}

print_cmd() {
  printf '%q ' "$@"
  echo
}

# Print the command under --dry-run, else replace this shell with it.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then print_cmd "$@"; exit 0; fi
  exec "$@"
}

# The trainer's nodes: reads and checks NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, LAUNCHER and
# STRATEGY (the settings train_sft.sh and train_grpo.sh document), with their defaults.
node_settings() {
  [[ -z "${MAIN_PORT:-}" ]] || die "MAIN_PORT=$MAIN_PORT: the setting is MASTER_PORT now, as in train_grpo.sh"
  NNODES=${NNODES:-1}
  NODE_RANK=${NODE_RANK:-0}
  MASTER_PORT=${MASTER_PORT:-29500}
  LAUNCHER=${LAUNCHER:-accelerate}
  STRATEGY=${STRATEGY:-ddp}
  require_int NNODES "$NNODES" 1
  require_int NODE_RANK "$NODE_RANK" 0
  (( NODE_RANK < NNODES )) || die "NODE_RANK=$NODE_RANK must be below NNODES=$NNODES"
  # A loopback MASTER_ADDR on node 1 is node 1 itself: its launcher would wait for a rendezvous store
  # there until the rendezvous timed out. Nodes on one machine (GPUS=0, tests/test_two_nodes.py) are
  # the one place it is right.
  if (( NNODES > 1 )); then
    [[ -n "${MASTER_ADDR:-}" ]] \
      || die "NNODES=$NNODES needs MASTER_ADDR: node 0's address on the network the nodes share, the same on every node"
    [[ "${GPUS:-}" == 0 ]] || ! is_loopback "$MASTER_ADDR" \
      || die "MASTER_ADDR=$MASTER_ADDR is a loopback address here, which the other nodes cannot reach: set node 0's address on the network the nodes share, the same on every node (only GPUS=0 runs nodes on one machine)"
  fi
  MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
  require_int MASTER_PORT "$MASTER_PORT" 1
  require_one_of LAUNCHER "$LAUNCHER" accelerate torchrun
  require_one_of STRATEGY "$STRATEGY" ddp fsdp
  [[ "$LAUNCHER" == accelerate || "$STRATEGY" == ddp ]] \
    || die "STRATEGY=$STRATEGY needs LAUNCHER=accelerate (torchrun runs plain DDP)"
}

# Whether ADDR is this machine's loopback (127.0.0.0/8, ::1), as an address or as a name that resolves
# only to loopback addresses here ($(hostname) does, to 127.0.1.1, on Debian's and Ubuntu's /etc/hosts).
is_loopback() {  # ADDR
  local addrs
  addrs=$(getent ahosts "$1" 2>/dev/null | awk '{print $1}' | sort -u) || true
  [[ -n "$addrs" ]] || addrs=$1
  ! grep -qvE '^(127\.|::1$|::ffff:127\.)' <<< "$addrs"
}

# Sets LAUNCH: the launcher (accelerate or torchrun, from node_settings) that starts PROCESSES
# processes on this node, NNODES x PROCESSES in the job, which `-m emoji_rl.cli STAGE ...` follows.
# Without CUDA they run on the CPU over gloo: the multi-node path without GPUs.
launcher() {  # PROCESSES
  if [[ "$LAUNCHER" == accelerate ]]; then
    # accelerate counts processes over all nodes.
    LAUNCH=(
      "$PYTHON" -m accelerate.commands.launch
      --config_file "configs/accelerate/$STRATEGY.yaml"
      --num_machines "$NNODES"
      --machine_rank "$NODE_RANK"
      --main_process_ip "$MASTER_ADDR"
      --main_process_port "$MASTER_PORT"
      --num_processes "$(($1 * NNODES))"
    )
  else
    LAUNCH=(
      "$PYTHON" -m torch.distributed.run
      --nnodes "$NNODES"
      --node_rank "$NODE_RANK"
      --nproc_per_node "$1"
      --master_addr "$MASTER_ADDR"
      --master_port "$MASTER_PORT"
    )
  fi
}

# >>> GPU layout
# GPU layout (planned for 80 GB cards; docs/gpu/README.md's sizing table gives the reasons). The judge
# server, the policy server and the trainer each get their own GPUs: vLLM claims its
# --gpu-memory-utilization share of a card when it starts and refuses to start if less is free, and
# a trainer beside a server runs out of memory mid-run. Defaults, by GPUS (the box's GPU count):
#
#   GPUS  JUDGE_GPUS    POLICY_GPUS                     TRAIN_GPUS
#   0     the CPU       the CPU                         the CPU (NGPUS processes per node: 1)
#   1     none          none: GRPO runs --engine hf     0
#   2     0 (TP 1)      none: GRPO runs --engine hf     1
#   4     0,1 (TP 2)    2                               3
#   8     0,1 (TP 2)    2,3 (2 data-parallel)           4,5,6,7 (4 processes: batch_size 32 divides)
#
# Another count takes the largest of these that fits and names the GPUs left idle. Set any of
# JUDGE_GPUS, POLICY_GPUS, TRAIN_GPUS to override it; set but empty, that process has no GPU on this
# box (its server runs elsewhere, or not at all). GPUS=0 is a box without GPUs: both servers run
# vLLM's CPU engine (make setup-vllm-engine) and serve the cpu profile's model unless told otherwise,
# fp32, with CPU_KVCACHE_GIB of KV cache each (1), and the trainer runs on the CPU: one process, or
# NGPUS processes per node over gloo (NNODES > 1 runs several nodes so, docs/gpu/README.md).
# Sets that share a GPU are refused before anything
# starts, and so are JUDGE_TP x JUDGE_DP or POLICY_TP x POLICY_DP other than their GPU count.
# SFT runs alone, before the servers: launch/train_sft.sh takes every GPU unless TRAIN_GPUS is set.
# <<< GPU layout

# The judge's 61 GB wants TP on two cards for KV-cache room; the 4B policy fits one card, so more
# GPUs make replicas. Trainer processes stay a power of two so the step's 32 prompts divide.
layout_defaults() {  # SIZE: "JUDGE_GPUS POLICY_GPUS TRAIN_GPUS" of that layout, "-" for none
  case "$1" in
    1) echo "- - 0" ;;
    2) echo "0 - 1" ;;
    4) echo "0,1 2 3" ;;
    8) echo "0,1 2,3 4,5,6,7" ;;
  esac
}

count_list() {  # LIST: the number of comma-separated items
  local items
  IFS=, read -r -a items <<< "$1"
  echo "${#items[@]}"
}

# Sets and exports GPUS, GPU_LAYOUT (the default layout's size), JUDGE_GPUS, POLICY_GPUS, TRAIN_GPUS
# and, for a server that has GPUs, its *_TP and *_DP; exits 2 on a layout vLLM or CUDA would reject.
gpu_layout() {
  GPUS=${GPUS:-$(count_gpus)}
  require_int GPUS "$GPUS" 0
  if (( GPUS == 0 )); then
    cpu_layout
    return
  fi
  GPU_LAYOUT=1
  local size name defaulted=0 defaults
  for size in 2 4 8; do (( GPUS >= size )) && GPU_LAYOUT=$size; done
  read -r -a defaults <<< "$(layout_defaults "$GPU_LAYOUT")"
  local i=0
  for name in JUDGE_GPUS POLICY_GPUS TRAIN_GPUS; do
    # Only an unset variable takes the default: set but empty means "no GPU here".
    if [[ -z "${!name+set}" ]]; then
      defaulted=1
      if [[ "${defaults[$i]}" == - ]]; then printf -v "$name" ''; else printf -v "$name" '%s' "${defaults[$i]}"; fi
    fi
    i=$((i + 1))
  done
  export GPUS GPU_LAYOUT JUDGE_GPUS POLICY_GPUS TRAIN_GPUS

  local -A seen
  local gpu items
  for name in JUDGE_GPUS POLICY_GPUS TRAIN_GPUS; do
    [[ -z "${!name}" || "${!name}" =~ ^[A-Za-z0-9:-]+(,[A-Za-z0-9:-]+)*$ ]] \
      || die "$name=${!name} must be GPU ids separated by commas, e.g. 0,1 (CUDA_VISIBLE_DEVICES syntax)"
    seen=()
    IFS=, read -r -a items <<< "${!name}"
    for gpu in ${items[@]+"${items[@]}"}; do
      [[ -z "${seen[$gpu]:-}" ]] || die "$name=${!name} names GPU $gpu twice"
      seen[$gpu]=1
    done
  done
  local clashes='' pair a b shared
  for pair in "JUDGE_GPUS POLICY_GPUS" "JUDGE_GPUS TRAIN_GPUS" "POLICY_GPUS TRAIN_GPUS"; do
    read -r a b <<< "$pair"
    shared=$(shared_gpus "${!a}" "${!b}")
    [[ -z "$shared" ]] || clashes+="$a=${!a} and $b=${!b} share GPU $shared; "
  done
  [[ -z "$clashes" ]] \
    || die "${clashes%; }: the judge server, the policy server and the trainer each need GPUs of their own"

  parallel_sizes JUDGE TP
  parallel_sizes POLICY DP

  if (( defaulted )); then
    local idle=()
    for ((i = 0; i < GPUS; i++)); do
      [[ ",$JUDGE_GPUS,$POLICY_GPUS,$TRAIN_GPUS," == *",$i,"* ]] || idle+=("$i")
    done
    if [[ ${#idle[@]} -gt 0 ]]; then
      local IFS=,
      echo "$SCRIPT: GPUS=$GPUS: the $GPU_LAYOUT-GPU layout leaves GPU ${idle[*]} idle (set JUDGE_GPUS, POLICY_GPUS, TRAIN_GPUS to use them)" >&2
    fi
  fi
}

cpu_layout() {
  GPU_LAYOUT=0
  local name
  for name in JUDGE_GPUS POLICY_GPUS TRAIN_GPUS; do
    [[ -z "${!name:-}" ]] || die "GPUS=0 runs everything on the CPU, but $name=${!name}: unset it, or set GPUS to the box's GPU count"
    printf -v "$name" ''
  done
  CPU_KVCACHE_GIB=${CPU_KVCACHE_GIB:-1}
  require_int CPU_KVCACHE_GIB "$CPU_KVCACHE_GIB" 1
  export GPUS GPU_LAYOUT JUDGE_GPUS POLICY_GPUS TRAIN_GPUS CPU_KVCACHE_GIB
}

on_cpu() { [[ "${GPU_LAYOUT:-}" == 0 ]]; }

# Whether the layout runs this server (JUDGE or POLICY): on the CPU, or on GPUs of its own.
has_server() {  # PREFIX
  local gpus="$1_GPUS"
  on_cpu || [[ -n "${!gpus}" ]]
}

# The URL this machine reaches a server (JUDGE or POLICY) at: its bind address, PREFIX_HOST, with
# a wildcard (all interfaces) reached through loopback; a server bound to one interface's address does
# not answer on 127.0.0.1.
server_url() {  # PREFIX
  local host="$1_HOST" port="$1_PORT"
  host=${!host:-127.0.0.1}
  case "$host" in
    0.0.0.0) host=127.0.0.1 ;;
    ::|'[::]') host='[::1]' ;;
    \[*) ;;
    *:*) host="[$host]" ;;  # an IPv6 address
  esac
  echo "http://$host:${!port}"
}

# Where a server runs, for its command: DEVICE_ENV (words for `env`) and DEVICE_FLAGS (`vllm serve`).
server_device() {  # PREFIX (JUDGE or POLICY)
  local gpus="$1_GPUS" tp="$1_TP" dp="$1_DP" memory="$1_GPU_MEMORY"
  if on_cpu; then
    # nobind: vLLM would pin its threads to cores another server or the trainer also uses. PASSIVE:
    # OpenMP threads that spin while they wait take those shared cores from the other processes.
    DEVICE_ENV=("VLLM_CPU_KVCACHE_SPACE=$CPU_KVCACHE_GIB" VLLM_CPU_OMP_THREADS_BIND=nobind OMP_WAIT_POLICY=PASSIVE)
    DEVICE_FLAGS=(--dtype float32)
  else
    DEVICE_ENV=("CUDA_VISIBLE_DEVICES=${!gpus}")
    DEVICE_FLAGS=(--tensor-parallel-size "${!tp}" --data-parallel-size "${!dp}" --gpu-memory-utilization "${!memory}")
  fi
}

shared_gpus() {  # LIST LIST: the GPUs both name, comma-separated
  local a b left right out=()
  IFS=, read -r -a left <<< "$1"
  IFS=, read -r -a right <<< "$2"
  for a in ${left[@]+"${left[@]}"}; do
    for b in ${right[@]+"${right[@]}"}; do [[ "$a" == "$b" ]] && out+=("$a"); done
  done
  local IFS=,
  echo "${out[*]}"
}

# PREFIX_TP x PREFIX_DP must be the number of PREFIX_GPUS: vLLM starts TP x DP workers, one per
# visible GPU. FILL (TP or DP) is the size derived from the GPU count when it is not set; the
# other defaults to 1. A server with no GPUs here is not checked.
parallel_sizes() {  # PREFIX FILL
  local prefix=$1 fill=$2 other gpus_name="$1_GPUS"
  [[ -n "${!gpus_name}" ]] || return 0
  [[ "$fill" == TP ]] && other=DP || other=TP
  local n fill_name="${prefix}_$fill" other_name="${prefix}_$other"
  n=$(count_list "${!gpus_name}")
  printf -v "$other_name" '%s' "${!other_name:-1}"
  require_int "$other_name" "${!other_name}" 1
  if [[ -z "${!fill_name:-}" ]]; then
    (( n % ${!other_name} == 0 )) \
      || die "$gpus_name=${!gpus_name} ($n GPUs) does not split into $other_name=${!other_name}"
    printf -v "$fill_name" '%s' "$((n / ${!other_name}))"
  fi
  require_int "$fill_name" "${!fill_name}" 1
  local tp_name="${prefix}_TP" dp_name="${prefix}_DP"
  (( ${!tp_name} * ${!dp_name} == n )) \
    || die "$tp_name=${!tp_name} x $dp_name=${!dp_name} = $((${!tp_name} * ${!dp_name})), but $gpus_name=${!gpus_name} lists $n GPU(s): vLLM runs one worker per GPU"
  export "${prefix}_TP" "${prefix}_DP"
}

# NGPUS, where a user still sets it, must agree with the trainer's GPUs: one process per GPU.
check_ngpus() {  # GPU_LIST DESCRIPTION
  local n
  n=$(count_list "$1")
  [[ -z "${NGPUS:-}" || "$NGPUS" == "$n" ]] \
    || die "NGPUS=$NGPUS, but $2 holds $n GPU(s): the trainer runs one process per GPU; set TRAIN_GPUS instead"
}

# Exit 2 before a trainer starts on GPUs that something already holds (a vLLM server started by hand,
# another job): it would run out of memory at load or at its first step. LIST: GPU ids, or all. Not
# under --dry-run, nor without GPUs; without nvidia-smi nothing is checked.
require_free_gpus() {  # LIST
  [[ "$DRY_RUN" == 1 || "${GPUS:-}" == 0 ]] && return 0
  pick_python
  "$PYTHON" -m emoji_rl.io.nvidia_smi --gpus "$1" --for "$SCRIPT" || exit 2
}

# SERVER_FLAGS: the stage flags that point it at the servers the layout runs here (judge, policy),
# where they listen: JUDGE_HOST:JUDGE_PORT and POLICY_HOST:POLICY_PORT, as serve_judge.sh and
# serve_policy.sh bind them. with_servers.sh and gpu_smoke.sh tell their stages so.
server_flags() {  # SERVER...
  SERVER_FLAGS=()
  local server
  for server in "$@"; do
    case "$server" in
      judge) SERVER_FLAGS+=(--judge_url "$(server_url JUDGE)") ;;
      policy) SERVER_FLAGS+=(--vllm_url "$(server_url POLICY)") ;;
    esac
  done
}
