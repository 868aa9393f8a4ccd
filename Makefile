# Two commands do all set-up on a fresh machine (see README):
#   make sample   create .venv, install, run the main job on the example prompts
#   make test     create .venv, install, run the test suite
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed

.PHONY: sample test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[test,bench]"
	touch $(STAMP)

sample: $(STAMP)
	$(VENV)/bin/presto-ray sample --config configs/toy.yaml --out out/samples.parquet

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/presto-ray bench --out bench/results/toy.json

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
