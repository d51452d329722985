# Pipeline-stage and GPU-box targets; the Makefile includes this file (`include launch/targets.mk`).
#   PROFILE=cpu (default)  a stage runs in one process on the embedded models, configs/cpu/
#   PROFILE=gpu            through the launch/ scripts (settings: environment variables, see --help)
#   NGPUS=N                trainer processes (sft, rl) or the judge's tensor-parallel size (serve-judge)
#   ARGS="--field value"   overrides passed to the stage
#   make serve-judge PROFILE=gpu NGPUS=2      make rl PROFILE=gpu NGPUS=4 ARGS="--max_steps 100"
PROFILE ?= cpu
NGPUS ?=
ARGS ?=
BIN ?= .venv/bin
OFFLINE ?= HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Stages on the cpu profile need the venv the Makefile builds; the gpu scripts pick their interpreter.
CPU_DEPS := $(if $(filter cpu,$(PROFILE)),$(STAMP))

ifeq ($(filter $(PROFILE),cpu gpu),)
$(error PROFILE=$(PROFILE) must be cpu or gpu)
endif

# Servers exist only on the gpu profile: on cpu the judge and the sender run in the trainer's process.
define gpu_only
@test "$(PROFILE)" = gpu || { echo "make $@: needs PROFILE=gpu (the cpu profile runs the judge and the sender in-process)" >&2; exit 2; }
endef

.PHONY: serve-judge serve-policy sft rl eval gpu-smoke setup-vllm

serve-judge: ## vLLM judge server, PROFILE=gpu (NGPUS = tensor-parallel size; see launch/serve_judge.sh --help)
	$(gpu_only)
	$(if $(NGPUS),JUDGE_TP=$(NGPUS) )launch/serve_judge.sh $(ARGS)

serve-policy: ## vLLM policy server with runtime LoRA loading, PROFILE=gpu (launch/serve_policy.sh --help)
	$(gpu_only)
	launch/serve_policy.sh $(ARGS)

sft: $(CPU_DEPS) ## LoRA SFT of the sender (gpu: launch/train_sft.sh over NGPUS GPUs)
ifeq ($(PROFILE),gpu)
	$(if $(NGPUS),NGPUS=$(NGPUS) )launch/train_sft.sh $(ARGS)
else
	$(OFFLINE) $(BIN)/emoji-rl sft --config configs/cpu/sft.yaml $(ARGS)
endif

rl: $(CPU_DEPS) ## GRPO of the sender (gpu: launch/train_grpo.sh over NGPUS GPUs, vllm servers started first)
ifeq ($(PROFILE),gpu)
	$(if $(NGPUS),NGPUS=$(NGPUS) )launch/train_grpo.sh $(ARGS)
else
	$(OFFLINE) $(BIN)/emoji-rl grpo --config configs/cpu/grpo.yaml $(ARGS)
endif

eval: $(CPU_DEPS) ## Retrieval evaluation: base vs SFT vs RL on the held-out split
ifeq ($(PROFILE),gpu)
	$(BIN)/emoji-rl eval-retrieval --config configs/gpu/eval_retrieval.yaml $(ARGS)
else
	$(OFFLINE) $(BIN)/emoji-rl eval-retrieval --config configs/cpu/eval_retrieval.yaml $(ARGS)
endif

gpu-smoke: ## Both servers, two GRPO steps and one eval on a GPU box; PASS/FAIL per stage
	launch/gpu_smoke.sh $(ARGS)

setup-vllm: ## The vLLM servers' own venv (.venv-vllm): vllm 0.33 pins a torch the trainer cannot share
	test -x .venv-vllm/bin/python || python3 -m venv .venv-vllm
	.venv-vllm/bin/python -m pip install --quiet vllm==0.33.0
