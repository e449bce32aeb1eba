# The two commands in the README: `make reproduce` (the main job) and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup system-deps test reproduce lab ui lint bench clean-venv team-server team-server-stop team-server-status \
	team-server-backup team-server-restore

setup:
	@scripts/setup.sh

# Debian packages the tests need (chromium + chromium-driver for the browser tests,
# libopenblas0-pthread for MLX, postgresql for the team server); setup runs it too.
system-deps:
	@scripts/system-deps.sh

test: setup
	$(BIN)/python -m pytest

# The inner loop: every test but those marked slow (each more than ~3 s on a 2-core box:
# papermill end to end, sweeps, servers, browsers, the real-model MLX conversion, real-engine
# runs over every workload). `make test` runs them all, as CI does.
.PHONY: test-quick
test-quick: setup
	$(BIN)/python -m pytest -m "not slow"

reproduce: setup
	$(BIN)/labkit reproduce

# JupyterLab on the project's `labkit` kernel (scripts/setup.sh installs it into the venv),
# with the project config (jupyter-config/: no news popup, IPC kernels; saved notebooks keep their
# outputs, which the nbstripout git filter keeps out of git); --allow-root where CI/containers run as root.
lab: setup
	$(BIN)/jupyter lab --ip 127.0.0.1 --no-browser --config jupyter-config/jupyter_server_config.py \
		$$([ "$$(id -u)" = 0 ] && echo --allow-root) notebooks

ui: setup
	$(BIN)/labkit ui

lint: setup
	$(BIN)/ruff check src tests benchmarks

bench: setup
	$(BIN)/python benchmarks/bench_lookup.py

clean-venv:
	rm -rf $(VENV)

# The team's lab book: PostgreSQL + `mlflow server --serve-artifacts` on 127.0.0.1:5005
# (LABKIT_TEAM_HOST/PORT/DIR/ARTIFACTS: see scripts/team-server.sh and docs/team.md).
# Prints the URI clients put in MLFLOW_TRACKING_URI.
team-server: setup
	@scripts/team-server.sh start

team-server-stop:
	@scripts/team-server.sh stop

team-server-status:
	@scripts/team-server.sh status

# One dated archive (pg_dump of runs and users, the artifacts, a checksum manifest) into
# OUT (default $$LABKIT_TEAM_DIR/backups); restore refuses a running server unless FORCE=1.
team-server-backup:
	@scripts/team-server.sh backup $(OUT)

team-server-restore:
	@scripts/team-server.sh restore "$(ARCHIVE)" $(if $(FORCE),--force)
