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

# Mutation testing (mutmut 3, config in pyproject.toml [tool.mutmut]); results stay in mutants/ between runs.
# The whole core is hours on 2 cores: mutate-sample time-boxes one module (MODULE, MUTATE_S seconds).
MODULE ?= metrics
MUTATE_S ?= 900
CHILDREN ?= 1
$(VENV)/.mutmut: $(BIN)/pdsim
	$(BIN)/pip install -q -e '.[test,mutate]'
	touch $(VENV)/.mutmut

mutate: $(VENV)/.mutmut
	$(BIN)/mutmut run --max-children $(CHILDREN); $(BIN)/mutmut results

mutate-sample: $(VENV)/.mutmut
	-timeout --signal=INT $(MUTATE_S) $(BIN)/mutmut run --max-children $(CHILDREN) "pdsim.$(MODULE).*"
	$(BIN)/python benchmarks/mutation_score.py $(MODULE)

bench: $(BIN)/pdsim
	$(BIN)/python benchmarks/bench_speed.py

bench-all: bench
	$(BIN)/python benchmarks/bench_scale.py
	$(BIN)/python benchmarks/bench_plan.py
	$(BIN)/python benchmarks/check_vidur_linear.py
	$(BIN)/python benchmarks/bench_input_guards.py
