# Pipeline-stage and GPU-box targets; the Makefile includes this file (`include launch/targets.mk`).
#   PROFILE=cpu (default)  a stage runs in one process on the embedded models, configs/cpu/
#   PROFILE=gpu            through the launch/ scripts (settings: environment variables, see --help)
#   ARGS="--field value"   overrides passed to the stage (ARGS=--dry-run: print the command only)
# The gpu targets share one GPU layout (launch/common.sh): the judge server on JUDGE_GPUS, the policy
# server on POLICY_GPUS, GRPO and the evaluation on TRAIN_GPUS, disjoint, picked from GPUS (the
# box's GPU count, by default what nvidia-smi lists); SFT runs alone on every GPU. These variables
# reach the scripts as they are, since make exports its command-line variables.
#   make serve-judge PROFILE=gpu      make rl PROFILE=gpu ARGS="--max_steps 100"      make eval PROFILE=gpu GPUS=8
# Asynchronous GRPO: give the policy server and the trainer the same MAX_OFF_POLICY_STEPS (K; unset, the
# server holds 2 adapter versions and the trainer takes its config's K):
#   make serve-policy PROFILE=gpu MAX_OFF_POLICY_STEPS=2      make rl PROFILE=gpu MAX_OFF_POLICY_STEPS=2
PROFILE ?= cpu
ARGS ?=
BIN ?= .venv/bin
OFFLINE ?= HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Stages on the cpu profile need the venv the Makefile builds; the gpu scripts pick their interpreter.
CPU_DEPS := $(if $(filter cpu,$(PROFILE)),$(STAMP))
# The cpu profile never reaches a model hub; the gpu profile downloads its models.
OFFLINE_IF_CPU := $(if $(filter cpu,$(PROFILE)),$(OFFLINE))

ifeq ($(filter $(PROFILE),cpu gpu),)
$(error PROFILE=$(PROFILE) must be cpu or gpu)
endif

# Servers exist only on the gpu profile: on cpu the judge and the sender run in the trainer's process.
define gpu_only
@test "$(PROFILE)" = gpu || { echo "make $@: needs PROFILE=gpu (the cpu profile runs the judge and the sender in-process)" >&2; exit 2; }
endef

.PHONY: serve-judge serve-policy sft rl eval gpu-smoke setup-vllm setup-gpu pipeline experiment wordle

# A stage list (emoji-rl pipeline): a rerun skips the finished stages and goes on from the interrupted one.
#   make experiment                     configs/$(PROFILE)/experiment.yaml into its run_dir
#   make pipeline CONFIG=FILE.yaml ARGS="--dry_run true"      ARGS="--run_dir DIR" / "--from_stage NAME"
# Out of the stages' environment: the launch scripts read CONFIG as their stage's config file.
CONFIG ?= configs/$(PROFILE)/experiment.yaml

pipeline: $(CPU_DEPS) ## Run the stages of CONFIG in order, resumable (emoji-rl pipeline; ARGS="--dry_run true")
	env -u CONFIG $(OFFLINE_IF_CPU) $(BIN)/emoji-rl pipeline --config $(CONFIG) $(ARGS)

experiment: $(CPU_DEPS) ## The whole experiment of PROFILE (configs/PROFILE/experiment.yaml), resumable
	env -u CONFIG $(OFFLINE_IF_CPU) $(BIN)/emoji-rl pipeline --config configs/$(PROFILE)/experiment.yaml $(ARGS)

wordle: $(CPU_DEPS) ## Wordle end to end on PROFILE: solver traces, SFT, GRPO, eval vs the solver (resumable)
	env -u CONFIG $(OFFLINE_IF_CPU) $(BIN)/emoji-rl pipeline --config configs/$(PROFILE)/wordle.yaml $(ARGS)

# NGPUS once sized the judge here; the layout does now, and a silent change of meaning would start a
# judge on other GPUs than the user asked for.
serve-judge: ## vLLM judge server on JUDGE_GPUS, PROFILE=gpu (launch/serve_judge.sh --help)
	$(gpu_only)
	@test -z "$(NGPUS)" || { echo "make $@: NGPUS no longer sets the judge's GPUs: set JUDGE_GPUS (its TP size follows; see launch/serve_judge.sh --help)" >&2; exit 2; }
	launch/serve_judge.sh $(ARGS)

serve-policy: ## vLLM policy server on POLICY_GPUS with runtime LoRA loading, PROFILE=gpu (launch/serve_policy.sh --help)
	$(gpu_only)
	launch/serve_policy.sh $(ARGS)

sft: $(CPU_DEPS) ## LoRA SFT of the sender (gpu: launch/train_sft.sh, every GPU or NGPUS of them)
ifeq ($(PROFILE),gpu)
	launch/train_sft.sh $(ARGS)
else
	$(OFFLINE) $(BIN)/emoji-rl sft --config configs/cpu/sft.yaml $(ARGS)
endif

rl: $(CPU_DEPS) ## GRPO of the sender (gpu: launch/train_grpo.sh on TRAIN_GPUS, servers started first)
ifeq ($(PROFILE),gpu)
	launch/train_grpo.sh $(ARGS)
else
	$(OFFLINE) $(BIN)/emoji-rl grpo --config configs/cpu/grpo.yaml $(ARGS)
endif

eval: $(CPU_DEPS) ## Retrieval evaluation: base vs SFT vs RL on the held-out split (gpu: on TRAIN_GPUS)
ifeq ($(PROFILE),gpu)
	launch/eval_retrieval.sh $(ARGS)
else
	$(OFFLINE) $(BIN)/emoji-rl eval-retrieval --config configs/cpu/eval_retrieval.yaml $(ARGS)
endif

gpu-smoke: ## The layout's servers, two GRPO steps and one eval on a GPU box; PASS/FAIL per stage
	launch/gpu_smoke.sh $(ARGS)

setup-vllm: ## The vLLM servers' own venv (.venv-vllm): vllm 0.33 pins a torch the trainer cannot share
	test -x .venv-vllm/bin/python || python3 -m venv .venv-vllm
	.venv-vllm/bin/python -m pip install --quiet vllm==0.33.0

# A GPU box's whole set-up: .venv (on a CUDA box pip takes torch's CUDA build), the gpu extra's kernels
# compiled for this box's GPUs (launch/setup_gpu.sh: ninja, their architectures only, MAX_JOBS), and
# .venv-vllm. CUDA_ARCHS, MAX_JOBS and NVCC_THREADS reach the script (launch/setup_gpu.sh --help).
setup-gpu: $(STAMP) setup-vllm ## On a GPU box: .venv, flash-attn 2 and Qwen3.5's kernels compiled for its GPUs, .venv-vllm
	launch/setup_gpu.sh
