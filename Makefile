# meshtwin: two commands for a new user (`make run`, `make test`), plus developer targets.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TWIN   := $(VENV)/bin/twin
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow fuzz differential bench lint validate mutate clean aot

# Create the virtual environment and install the package with its test extra.
# Re-runs only when the packaging files change, so the second call is fast.
$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The FR-FCFS engine compiled ahead of time (devices/hbm/aot.py), so that a fresh process does not
# pay Numba's ~0.8 s start before its first HBM simulation; a no-op when it is up to date, a
# warning (and the JIT build used) when there is no C compiler. The package's own modules are
# compiled to bytecode too: an editable install leaves them as source, and with
# PYTHONDONTWRITEBYTECODE set every command would compile each module it imports again
# (~0.1 s of `twin check`). Python checks each file's timestamp, so an edited module is
# recompiled, never run stale.
aot: $(STAMP)
	$(PY) -m devices.hbm.aot
	$(PY) -m compileall -q twin devices workloads scenarios topologies experiments

run: $(STAMP) aot
	$(TWIN) run scenarios/quickstart.yaml -o runs/quickstart.h5 --plot runs/quickstart.png

# The suite runs on TEST_WORKERS processes (pytest-xdist; 2 = the cores of the CI machine);
# `make test TEST_WORKERS=0` runs it in this process, in file order.
TEST_WORKERS ?= 2

test: $(STAMP) aot
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS)

test-slow: $(STAMP) aot
	$(PY) -m pytest -q -m slow

# The long fuzz run of the front door (not part of `make test`): 5,000 hostile inputs, each in a
# forked, memory- and time-limited child; fails on any traceback, hang or exit code not 0/2.
fuzz: $(STAMP) aot
	$(PY) -m tests.fuzzing --cases 5000 --seed 0 --timeout 25

# Fast mode against exact mode on 200 random scenarios (not part of `make test`; tens of minutes).
differential: $(STAMP) aot
	$(PY) -m tests.differential --cases 200 --seed 0

# Mutation testing of the model's core (not part of `make test`; see tools/mutate.py):
# `make mutate MUTATE_ARGS="--module flows --max 40"` for one module or a seeded sample.
mutate: $(STAMP) aot
	$(PY) tools/mutate.py $(MUTATE_ARGS)

bench: $(STAMP) aot
	$(PY) -m experiments.bench $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

validate: $(STAMP) aot
	$(TWIN) validate

clean:
	rm -rf $(VENV) runs *.egg-info .pytest_cache .ruff_cache devices/hbm/_kernels_aot*
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
