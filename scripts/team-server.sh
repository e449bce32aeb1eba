#!/usr/bin/env bash
# A team MLflow server: PostgreSQL (Debian's package) for runs, a folder (or S3) for
# artifacts, `mlflow server` in front.   Usage: scripts/team-server.sh start|stop|status
#
# Why Debian's postgresql and not pip's pgserver: PostgreSQL refuses to run as root, and
# pgserver's answer (as root) is to `useradd` a `pgserver` user and chmod every parent of
# its data dir go+rx, /root included. Here, as root we run initdb/pg_ctl as the existing
# `postgres` system user (runuser); as anyone else, as that user. No TCP port for the
# database: it listens on a unix socket in $DIR/run only (listen_addresses=''), so
# parallel servers never collide and no other local user can reach its trust auth.
#
# Environment (all optional):
#   LABKIT_TEAM_DIR        data: pgdata/ artifacts/ logs/ run/
#                          (default ~/.local/share/labkit/team-server; as root
#                          /var/lib/labkit/team-server, since postgres cannot enter /root)
#   LABKIT_TEAM_HOST       address mlflow binds to (default 127.0.0.1)
#   LABKIT_TEAM_PORT       mlflow port (default 5005)
#   LABKIT_TEAM_ARTIFACTS  --artifacts-destination (default $DIR/artifacts; s3://bucket/path works)
#   LABKIT_TEAM_WAIT       seconds to wait for /health (default 120)
#   LABKIT_TEAM_WORKERS    mlflow worker processes (default 2)
#   LABKIT_MLFLOW          mlflow executable (default <repo>/.venv/bin/mlflow); its Python
#                          needs psycopg2-binary
#   LABKIT_PG_BIN          folder with initdb and pg_ctl (default: newest /usr/lib/postgresql/*/bin)
#   LABKIT_TEAM_EXTRA_ARGS extra words for `mlflow server` (e.g. "--app-name basic-auth")
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)

if [ "$(id -u)" -eq 0 ]; then DEFAULT_DIR=/var/lib/labkit/team-server
else DEFAULT_DIR=${XDG_DATA_HOME:-$HOME/.local/share}/labkit/team-server; fi
DIR=$(mkdir -p "${LABKIT_TEAM_DIR:-$DEFAULT_DIR}" && cd "${LABKIT_TEAM_DIR:-$DEFAULT_DIR}" && pwd)
HOST=${LABKIT_TEAM_HOST:-127.0.0.1}
PORT=${LABKIT_TEAM_PORT:-5005}
ARTIFACTS=${LABKIT_TEAM_ARTIFACTS:-$DIR/artifacts}
WAIT=${LABKIT_TEAM_WAIT:-120}
MLFLOW=${LABKIT_MLFLOW:-$REPO/.venv/bin/mlflow}
PY=$(dirname "$MLFLOW")/python
PGDATA=$DIR/pgdata RUN=$DIR/run LOGS=$DIR/logs
MLFLOW_PID=$RUN/mlflow.pid

log() { printf '[team-server] %s\n' "$*" >&2; }
die() { log "error: $1"; log "fix: $2"; exit 1; }

pg_bin() {
    if [ -n "${LABKIT_PG_BIN:-}" ]; then echo "$LABKIT_PG_BIN"; return; fi
    local d; d=$(printf '%s\n' /usr/lib/postgresql/*/bin | grep -v '\*' | sort -V | tail -n1 || true)
    if [ -n "$d" ]; then echo "$d"; return; fi
    command -v pg_ctl >/dev/null && dirname "$(command -v pg_ctl)" && return
    die "PostgreSQL not found" "run scripts/system-deps.sh (Debian package postgresql) or set LABKIT_PG_BIN"
}

# Run a PostgreSQL tool as an unprivileged user: postgres exits at once when euid is 0.
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# The client URI: user labkit, database mlflow, over the socket in $RUN. The driver is
# named: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, not psycopg2.
DB_URI="postgresql+psycopg2://labkit@/mlflow?host=$RUN"

mlflow_alive() { [ -f "$MLFLOW_PID" ] && kill -0 "$(cat "$MLFLOW_PID")" 2>/dev/null; }
pg_alive() { [ -f "$PGDATA/postmaster.pid" ] && as_pg "$(pg_bin)/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; }
url() { local h=$HOST; [ "$h" = 0.0.0.0 ] && h=127.0.0.1; echo "http://$h:$PORT"; }
healthy() { "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)' "$(url)" 2>/dev/null; }

start_postgres() {
    local bin; bin=$(pg_bin)
    mkdir -p "$PGDATA" "$RUN" "$LOGS"
    touch "$LOGS/postgres.log"
    if [ "$(id -u)" -eq 0 ]; then
        id postgres >/dev/null 2>&1 || die "no 'postgres' system user" "run scripts/system-deps.sh"
        chown postgres: "$PGDATA" "$RUN" "$LOGS/postgres.log"
        runuser -u postgres -- test -w "$PGDATA" ||
            die "the postgres user cannot reach $PGDATA (a parent folder is private)" \
                "set LABKIT_TEAM_DIR to a folder every parent of which is world-executable"
    fi
    chmod 700 "$PGDATA" "$RUN"
    # sun_path holds 107 bytes; the socket is $RUN/.s.PGSQL.5432.
    [ ${#RUN} -le 90 ] || die "socket path too long: $RUN" "use a shorter LABKIT_TEAM_DIR"
    if [ ! -f "$PGDATA/PG_VERSION" ]; then
        log "initdb $PGDATA"
        as_pg "$bin/initdb" -D "$PGDATA" -U labkit --auth=trust -E UTF8 --locale=C.UTF-8 >>"$LOGS/postgres.log"
        cat >>"$PGDATA/postgresql.conf" <<EOF
# labkit team server: unix socket only, in $RUN
listen_addresses = ''
unix_socket_directories = '$RUN'
unix_socket_permissions = 0700
EOF
    fi
    if ! pg_alive; then
        as_pg "$bin/pg_ctl" -D "$PGDATA" -l "$LOGS/postgres.log" -w -t 60 start >/dev/null ||
            die "PostgreSQL did not start" "see $LOGS/postgres.log"
    fi
    as_pg "$bin/psql" -h "$RUN" -U labkit -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='mlflow'" | grep -q 1 ||
        as_pg "$bin/createdb" -h "$RUN" -U labkit mlflow
}

start() {
    [ -x "$MLFLOW" ] || die "$MLFLOW not found" "run make setup, or set LABKIT_MLFLOW"
    "$PY" -c 'import psycopg2' 2>/dev/null ||
        die "psycopg2 is missing in $(dirname "$MLFLOW")" "$PY -m pip install psycopg2-binary"
    if mlflow_alive && healthy; then log "already running"; url; return; fi
    # Something else answering on the port would pass the /health wait below.
    if healthy; then die "$(url) already answers (another server)" "stop it, or set LABKIT_TEAM_PORT"; fi
    start_postgres
    mkdir -p "$LOGS"
    [[ $ARTIFACTS == *://* ]] || mkdir -p "$ARTIFACTS"
    log "mlflow server on $(url) (log: $LOGS/mlflow.log)"
    # setsid: mlflow forks uvicorn workers; its own process group lets stop end them all.
    # Job execution off: it starts ~7 huey consumers (~230 MB each) labkit never uses.
    # Split on spaces but never glob: "--allowed-hosts localhost:*" must stay as written.
    local extra=(); read -ra extra <<<"${LABKIT_TEAM_EXTRA_ARGS:-}"
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false} \
    setsid "$MLFLOW" server --backend-store-uri "$DB_URI" \
        --serve-artifacts --artifacts-destination "$ARTIFACTS" \
        --host "$HOST" --port "$PORT" --workers "${LABKIT_TEAM_WORKERS:-2}" \
        ${extra[@]+"${extra[@]}"} >>"$LOGS/mlflow.log" 2>&1 </dev/null &
    echo $! >"$MLFLOW_PID"
    local t0=$SECONDS
    until healthy; do
        if ! mlflow_alive; then tail -n 20 "$LOGS/mlflow.log" >&2; stop; die "mlflow server exited" "see $LOGS/mlflow.log"; fi
        if (( SECONDS - t0 >= WAIT )); then stop; die "no /health answer within ${WAIT}s" "see $LOGS/mlflow.log; raise LABKIT_TEAM_WAIT"; fi
        sleep 1
    done
    log "ready in $((SECONDS - t0)) s"
    url
}

stop() {
    if [ -f "$MLFLOW_PID" ]; then
        local pid; pid=$(cat "$MLFLOW_PID")
        # TERM the leader only: mlflow forwards it to uvicorn, which stops its workers in
        # order (TERM to the whole group races uvicorn into respawning workers). Then a
        # bounded wait for the whole group, then KILL whatever is left of it.
        kill -TERM "$pid" 2>/dev/null || kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 30); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        rm -f "$MLFLOW_PID"
    fi
    if pg_alive; then as_pg "$(pg_bin)/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null; fi
    log "stopped"
}

status() {
    local rc=0
    if mlflow_alive; then log "mlflow: pid $(cat "$MLFLOW_PID"), $(url)"; else log "mlflow: not running"; rc=3; fi
    if pg_alive; then log "postgres: running, $DB_URI"; else log "postgres: not running"; rc=3; fi
    return $rc
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
