# The two commands in the README: `make reproduce` (the main job) and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup system-deps test reproduce lab ui lint bench clean-venv

setup:
	@scripts/setup.sh

# Debian packages the tests need (chromium + chromium-driver for the browser tests,
# libopenblas0-pthread for MLX, postgresql for the team server); setup runs it too.
system-deps:
	@scripts/system-deps.sh

test: setup
	$(BIN)/python -m pytest

reproduce: setup
	$(BIN)/labkit reproduce

lab: setup
	$(BIN)/jupyter lab --ip 127.0.0.1 --no-browser notebooks

ui: setup
	$(BIN)/labkit ui

lint: setup
	$(BIN)/ruff check src tests benchmarks

bench: setup
	$(BIN)/python benchmarks/bench_lookup.py

clean-venv:
	rm -rf $(VENV)
