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

.PHONY: demo test test-deep bench bench-all install mutate mutate-sample mutants
install: $(BIN)/pdsim

demo: $(BIN)/pdsim
	$(BIN)/pdsim run scenarios/quickstart.yaml --out reports/quickstart

# After the suite, a time-boxed sample of the hand-made semantic mutants (benchmarks/semantic_mutants.py,
# tests/MUTANTS.md): mutants of recently changed files first, each group in a per-commit rotation, within
# MUTANTS_BUDGET_S seconds (copy, baseline and mutants together). The suite takes ~2.5-3 min on this 2-core
# machine alone (4 min with two other engineers at work), each mutant ~2-5 s: 90 s keeps `make test`
# within ~5 min when the machine is not shared. Any survivor, error or stale snippet fails it.
MUTANTS_BUDGET_S ?= 90
test: $(BIN)/pdsim $(VENV)/.torch
	$(BIN)/python -m pytest
	$(BIN)/python benchmarks/semantic_mutants.py --budget-s $(MUTANTS_BUDGET_S)

# every semantic mutant, no budget (~3-4 min on 2 cores)
mutants: $(BIN)/pdsim
	$(BIN)/python benchmarks/semantic_mutants.py --all

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
