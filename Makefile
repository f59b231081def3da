# Two commands on a fresh machine with only Python: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/pdsim: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/pdsim

$(VENV)/.torch: $(BIN)/pdsim
	# CPU build, pinned: an unpinned torch may pull a multi-GB CUDA build
	$(BIN)/pip install -q 'torch==2.13.0' || echo "torch unavailable: calibration tests will be skipped"
	touch $(VENV)/.torch

.PHONY: demo test test-deep bench bench-all install mutate mutate-sample
install: $(BIN)/pdsim

demo: $(BIN)/pdsim
	$(BIN)/pdsim run scenarios/quickstart.yaml --out reports/quickstart

test: $(BIN)/pdsim $(VENV)/.torch
	$(BIN)/python -m pytest

# hypothesis invariant tests with many more examples (profile `deep`, tests/conftest.py)
test-deep: $(BIN)/pdsim
	HYPOTHESIS_PROFILE=deep $(BIN)/python -m pytest tests/test_simulation.py tests/test_faults.py tests/test_fastpath.py -q

bench: $(BIN)/pdsim
	$(BIN)/python benchmarks/bench_speed.py

bench-all: bench
	$(BIN)/python benchmarks/bench_scale.py
	$(BIN)/python benchmarks/bench_plan.py
	$(BIN)/python benchmarks/check_vidur_linear.py
	$(BIN)/python benchmarks/bench_input_guards.py
