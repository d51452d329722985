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
# it lives in its own venv (make setup-vllm) and talks to the trainer over HTTP only.
pick_vllm() {
  if [[ -z "${VLLM:-}" ]]; then
    if [[ -x .venv-vllm/bin/vllm ]]; then VLLM=.venv-vllm/bin/vllm; else VLLM=vllm; fi
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
