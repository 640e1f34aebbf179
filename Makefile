# Every target that needs the environment depends on .venv/.installed, so a fresh clone needs
# nothing but Python 3.11 and pip: `make demo` and `make test` do all set-up.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-fast demo lint proto clean

install: $(STAMP)

# setup.py builds the optional C extension (kvmesh/_chain.c): an edit to it reinstalls.
$(STAMP): pyproject.toml setup.py kvmesh/_chain.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch lies on this machine's disk: install it first so the project's
	# resolution never pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,ray]"
	# best effort: a Redis built with TLS for the cluster-bus tests (the embedded one has none)
	bash tools/tls_redis.sh $(abspath $(VENV))/redis-tls
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q --hypothesis-profile=full

# The edit loop: no `integration` tests (they start processes, Redis, Ray or clusters), no
# `slow` ones, property tests under the light hypothesis profile (tests/conftest.py), on two
# xdist workers (a test file stays on one worker, so its module fixtures start once); it
# prints the slowest tests so that a new slow one is seen. Bytecode is cached even where the
# environment says not to: compiling and assert-rewriting every module again costs ~8 s a run.
test-fast: install
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -m "not integration and not slow" \
		--hypothesis-profile=fast -n 2 --dist loadfile --durations=15

demo: install
	$(BIN)/kvmesh demo

lint: install
	$(BIN)/ruff check .

proto: install
	$(BIN)/python -m tools.protogen

clean:
	rm -rf $(VENV) build *.egg-info
