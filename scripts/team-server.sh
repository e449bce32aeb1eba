#!/usr/bin/env bash
# A team MLflow server: PostgreSQL (Debian's package) for runs, a folder (or S3) for
# artifacts, `mlflow server` in front.
# Usage: scripts/team-server.sh start|stop|status|backup [DIR]|restore ARCHIVE [--force]
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
#   LABKIT_TEAM_AUTH_CACHE_S  seconds a worker remembers a user's checked password (default 60;
#                          0: every request checks it, ~140 ms of scrypt on a 2-core box). A user
#                          deleted or a password changed through MLflow's API is forgotten at once
#                          by the worker that handled it, by the others within this many seconds
#   LABKIT_MLFLOW          mlflow executable (default <repo>/.venv/bin/mlflow); its Python
#                          needs psycopg2-binary
#   LABKIT_PG_BIN          folder with initdb and pg_ctl (default: newest /usr/lib/postgresql/*/bin)
#   LABKIT_TEAM_EXTRA_ARGS extra words for `mlflow server`
#   LABKIT_TEAM_AUTH       1: users and passwords (MLflow's basic-auth app) even on loopback;
#                          0: none. Default: on for any address but loopback, and on for good
#                          once $DIR/auth/ exists (a restart never opens a server that had it)
#   LABKIT_TEAM_OPEN       1: serve a non-loopback address without auth anyway (logged)
#   LABKIT_TEAM_ADMIN_PASSWORD_FILE  the admin password to use on first start (default: one
#                          is generated into $DIR/auth/admin.password, mode 0600)
#   LABKIT_TEAM_TLS        1: serve HTTPS with a self-signed trial certificate ($DIR/tls/cert.pem,
#                          made on first start; LABKIT_TEAM_TLS_NAMES adds names, "DNS:a,IP:b")
#   LABKIT_TEAM_TLS_CERT, LABKIT_TEAM_TLS_KEY  serve HTTPS with the operator's certificate
#   LABKIT_NGINX           the nginx executable (default: nginx on PATH, Debian's nginx-light)
#
# TLS: nginx (Debian's) terminates it on $HOST:$PORT and proxies to mlflow on a loopback port
# of its own ($RUN/mlflow.port); the auth rules apply to $HOST, the address clients reach.
#
# Auth: $DIR/auth/ (0700) holds auth.ini (0600: MLflow's auth config; its admin_password is
# read once, to create the admin user), admin.password and flask.secret (0600). The users
# live in PostgreSQL beside the runs (database mlflow_auth), so one backup holds both. The
# admin password never goes into argv or any environment; only the Flask secret (CSRF) does,
# since MLflow reads it from nowhere else.
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
AUTH_DB_URI="postgresql+psycopg2://labkit@/mlflow_auth?host=$RUN"
AUTH=$DIR/auth

TLS_CERT=${LABKIT_TEAM_TLS_CERT:-} TLS_KEY=${LABKIT_TEAM_TLS_KEY:-}
PROXY=$DIR/proxy PROXY_PID=$RUN/nginx.pid INNER_PORT=$RUN/mlflow.port
tls_on() { [ -n "$TLS_CERT" ] || [ "${LABKIT_TEAM_TLS:-0}" = 1 ]; }
proxy_alive() { [ -f "$PROXY_PID" ] && kill -0 "$(cat "$PROXY_PID")" 2>/dev/null; }
mlflow_alive() { [ -f "$MLFLOW_PID" ] && kill -0 "$(cat "$MLFLOW_PID")" 2>/dev/null; }
pg_alive() { [ -f "$PGDATA/postmaster.pid" ] && as_pg "$(pg_bin)/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; }
url() { local h=$HOST s=http; [ "$h" = 0.0.0.0 ] && h=127.0.0.1; tls_on && s=https; echo "$s://$h:$PORT"; }
# The operator's own liveness probe on its own address: it checks that the server answers,
# not the certificate (clients check that, with MLFLOW_TRACKING_SERVER_CERT_PATH).
healthy() { "$PY" -c 'import ssl, sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=2, context=ssl._create_unverified_context())' "$(url)" 2>/dev/null; }

# The certificate nginx serves: the operator's, else a self-signed trial one made once.
tls_files() {
    if [ -n "$TLS_CERT" ]; then
        [ -r "$TLS_CERT" ] && [ -r "$TLS_KEY" ] || die "LABKIT_TEAM_TLS_CERT and LABKIT_TEAM_TLS_KEY must both name readable files" \
            "set both to the PEM files of the certificate (its chain appended) and its private key"
        CERT=$TLS_CERT KEY=$TLS_KEY; return
    fi
    CERT=$DIR/tls/cert.pem KEY=$DIR/tls/key.pem
    [ -f "$CERT" ] && return
    (umask 077; mkdir -p "$DIR/tls")
    openssl req -x509 -newkey rsa:2048 -nodes -days 90 -subj "/CN=labkit team server (SELF-SIGNED TRIAL)" \
        -addext "subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:$(hostname)${LABKIT_TEAM_TLS_NAMES:+,$LABKIT_TEAM_TLS_NAMES}" \
        -keyout "$KEY" -out "$CERT" 2>>"$LOGS/nginx.log" || die "openssl could not make a certificate" "see $LOGS/nginx.log"
    chmod 644 "$CERT"
    log "SELF-SIGNED TRIAL certificate $CERT (90 days): clients set MLFLOW_TRACKING_SERVER_CERT_PATH to a copy of it;"
    log "  for a real team give LABKIT_TEAM_TLS_CERT and LABKIT_TEAM_TLS_KEY"
}

# nginx in front of mlflow: TLS on $HOST:$PORT, everything streamed through (artifacts of any
# size), its temporary files and pid under $DIR.
start_proxy() {
    local nginx=${LABKIT_NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
    [ -x "$nginx" ] || die "nginx not found (it serves TLS)" "run scripts/system-deps.sh (Debian package nginx-light), or set LABKIT_NGINX"
    mkdir -p "$PROXY"
    local listen=$HOST; [[ $listen == *:* ]] && listen="[$listen]"
    cat >"$PROXY/nginx.conf" <<EOF
# written by scripts/team-server.sh on each start
pid $PROXY_PID;
error_log $LOGS/nginx.log warn;
events { worker_connections 512; }
http {
    access_log off;
    client_body_temp_path $PROXY/body; proxy_temp_path $PROXY/proxy; fastcgi_temp_path $PROXY/fastcgi;
    uwsgi_temp_path $PROXY/uwsgi; scgi_temp_path $PROXY/scgi;
    client_max_body_size 0;
    server {
        listen $listen:$PORT ssl;
        ssl_certificate $CERT;
        ssl_certificate_key $KEY;
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {
            proxy_pass http://127.0.0.1:$(cat "$INNER_PORT");
            proxy_set_header Host \$http_host;
            proxy_set_header X-Forwarded-Proto https;
            proxy_set_header X-Forwarded-For \$remote_addr;
            proxy_request_buffering off;
            proxy_buffering off;
            proxy_read_timeout 600s;
        }
    }
}
EOF
    "$nginx" -e "$LOGS/nginx.log" -c "$PROXY/nginx.conf" || die "nginx did not start" "see $LOGS/nginx.log"
}

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
    local db
    for db in mlflow mlflow_auth; do
        as_pg "$bin/psql" -h "$RUN" -U labkit -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$db'" | grep -q 1 ||
            as_pg "$bin/createdb" -h "$RUN" -U labkit "$db"
    done
}

loopback() { case $HOST in 127.*|localhost|::1) return 0 ;; *) return 1 ;; esac; }

# Whether this start serves with auth: on once $AUTH exists, on request, on for any address
# but loopback; an open non-loopback bind only with LABKIT_TEAM_OPEN=1.
auth_on() {
    if [ "${LABKIT_TEAM_OPEN:-0}" = 1 ]; then return 1; fi
    if [ -f "$AUTH/auth.ini" ]; then return 0; fi
    case ${LABKIT_TEAM_AUTH:-} in
        1) return 0 ;;
        0) loopback && return 1
           die "refusing to serve $HOST:$PORT without authentication (anyone who reaches it could write or delete the lab's runs)" \
               "unset LABKIT_TEAM_AUTH (auth is on by default off loopback), or set LABKIT_TEAM_OPEN=1 if a firewall or proxy guards it" ;;
        "") ! loopback ;;
        *) die "LABKIT_TEAM_AUTH=${LABKIT_TEAM_AUTH} is neither 0 nor 1" "set LABKIT_TEAM_AUTH=1 (users and passwords) or 0 (none)" ;;
    esac
}

# Every start with auth: how long a worker remembers a checked password (MLflow's
# auth_cache_ttl_seconds, off by default: then every request pays a scrypt check, and a tiny
# reproduction logged to the server takes several times as long as to a local store).
cache_ttl() {
    local ttl=${LABKIT_TEAM_AUTH_CACHE_S:-60}
    [[ $ttl =~ ^[0-9]+$ ]] || die "LABKIT_TEAM_AUTH_CACHE_S=$ttl is not a whole number of seconds" \
        "set it to 60 (the default), or 0 to check the password on every request"
    echo "$ttl"
}
auth_cache() {
    local ttl; ttl=$(cache_ttl) || exit 1
    "$PY" - "$AUTH/auth.ini" "$ttl" <<'PY' || exit 1
import configparser, sys
path, ttl = sys.argv[1], sys.argv[2]
ini = configparser.ConfigParser(interpolation=None)
ini.read(path)
if ini["mlflow"].get("auth_cache_ttl_seconds") != ttl:
    ini["mlflow"]["auth_cache_ttl_seconds"] = ttl
    with open(path, "w") as f:  # in place: the file keeps its mode (0600)
        ini.write(f)
PY
}

# First start with auth: the admin password (generated, or the operator's file, checked), the
# Flask secret and auth.ini, each readable by its owner only. Python reads and writes the
# password itself: it never passes through argv, the environment or this shell's variables.
setup_auth() {
    "$PY" -c 'import flask_wtf' 2>/dev/null ||
        die "MLflow's basic-auth app needs Flask-WTF, missing in $(dirname "$MLFLOW")" "$PY -m pip install 'mlflow[auth]' (make setup installs it)"
    [ -f "$AUTH/auth.ini" ] && return 0
    (umask 077; mkdir -p "$AUTH")
    chmod 700 "$AUTH"
    (umask 077; "$PY" - "$AUTH" "$AUTH_DB_URI" "${LABKIT_TEAM_ADMIN_PASSWORD_FILE:-}") <<'PY' || exit 1
import configparser, secrets, sys
from pathlib import Path
auth, db, given = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
if given:
    try:
        pw = Path(given).read_text().strip()
    except OSError as e:
        sys.exit(f"[team-server] error: cannot read LABKIT_TEAM_ADMIN_PASSWORD_FILE ({e.strerror})\n"
                 f"[team-server] fix: point it at a readable file holding the password")
    if len(pw) < 12 or len(set(pw)) < 6 or any(c.isspace() for c in pw):
        sys.exit("[team-server] error: the admin password in LABKIT_TEAM_ADMIN_PASSWORD_FILE is too weak "
                 f"({len(pw)} characters, {len(set(pw))} distinct)\n"
                 "[team-server] fix: use 12 or more characters, 6 or more of them distinct, no spaces; "
                 "or unset LABKIT_TEAM_ADMIN_PASSWORD_FILE and one is generated")
else:
    pw = secrets.token_urlsafe(24)
(auth / "admin.password").write_text(pw + "\n")
(auth / "flask.secret").write_text(secrets.token_hex(32) + "\n")
ini = configparser.ConfigParser(interpolation=None)
ini["mlflow"] = {
    "default_permission": "READ",
    "database_uri": db,
    "admin_username": "admin",
    "admin_password": pw,
    # MLflow's basic auth plus labkit's "readers create nothing" (labkit/provenance/auth_policy.py)
    "authorization_function": "labkit.provenance.auth_policy:authenticate",
}
with open(auth / "auth.ini", "w") as f:
    ini.write(f)
PY
    log "auth on: admin user 'admin', password in $AUTH/admin.password (mode 0600; add users with \`labkit team user add NAME --role reader|editor|admin\`)"
}

start() {
    [ -x "$MLFLOW" ] || die "$MLFLOW not found" "run make setup, or set LABKIT_MLFLOW"
    "$PY" -c 'import psycopg2' 2>/dev/null ||
        die "psycopg2 is missing in $(dirname "$MLFLOW")" "$PY -m pip install psycopg2-binary"
    if mlflow_alive && healthy; then
        tls_on && ! proxy_alive && die "the team server runs without TLS" "stop it (make team-server-stop), then start it with TLS"
        log "already running"; url; return
    fi
    # Something else answering on the port would pass the /health wait below.
    if healthy; then die "$(url) already answers (another server)" "stop it, or set LABKIT_TEAM_PORT"; fi
    # Before anything starts: refuse an open non-loopback bind, or a weak admin password.
    local use_auth=0
    if auth_on; then use_auth=1; cache_ttl >/dev/null; setup_auth; auth_cache; fi
    if tls_on; then mkdir -p "$LOGS"; tls_files; fi  # the operator's files readable, or a trial one made
    start_postgres
    mkdir -p "$LOGS"
    [[ $ARTIFACTS == *://* ]] || mkdir -p "$ARTIFACTS"
    log "mlflow server on $(url) (log: $LOGS/mlflow.log)"
    # setsid: mlflow forks uvicorn workers; its own process group lets stop end them all.
    # Job execution off: it starts ~7 huey consumers (~230 MB each) labkit never uses.
    # Split on spaces but never glob: "--allowed-hosts localhost:*" must stay as written.
    local extra=(); read -ra extra <<<"${LABKIT_TEAM_EXTRA_ARGS:-}"
    local bind=$HOST port=$PORT
    if tls_on; then  # mlflow on a loopback port of its own, nginx on $HOST:$PORT
        bind=127.0.0.1
        "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' >"$INNER_PORT"
        port=$(cat "$INNER_PORT")
        start_proxy
    fi
    if [ "$use_auth" = 1 ]; then
        extra+=(--app-name basic-auth)
        echo "[team-server] $(date -u +%FT%TZ) start on $HOST:$PORT with basic auth ($AUTH/auth.ini)" >>"$LOGS/mlflow.log"
    elif ! loopback; then
        echo "[team-server] $(date -u +%FT%TZ) start on $HOST:$PORT WITHOUT authentication: LABKIT_TEAM_OPEN=1" >>"$LOGS/mlflow.log"
        log "warning: $HOST:$PORT is open to anyone who reaches it (LABKIT_TEAM_OPEN=1)"
    fi
    (
        # The admin password comes from auth.ini only; an inherited one would override it.
        unset MLFLOW_AUTH_ADMIN_PASSWORD MLFLOW_AUTH_ADMIN_USERNAME
        if [ "$use_auth" = 1 ]; then
            # Fail closed: a route MLflow's auth has no rule for is refused to non-admins.
            export MLFLOW_AUTH_CONFIG_PATH="$AUTH/auth.ini" MLFLOW_BASIC_AUTH_FAIL_CLOSED=true
            MLFLOW_FLASK_SERVER_SECRET_KEY=$(cat "$AUTH/flask.secret"); export MLFLOW_FLASK_SERVER_SECRET_KEY
        fi
        export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
        exec setsid "$MLFLOW" server --backend-store-uri "$DB_URI" \
            --serve-artifacts --artifacts-destination "$ARTIFACTS" \
            --host "$bind" --port "$port" --workers "${LABKIT_TEAM_WORKERS:-2}" \
            ${extra[@]+"${extra[@]}"}
    ) >>"$LOGS/mlflow.log" 2>&1 </dev/null &
    echo $! >"$MLFLOW_PID"
    local t0=$SECONDS
    until healthy; do
        if ! mlflow_alive; then tail -n 20 "$LOGS/mlflow.log" >&2; stop; die "mlflow server exited" "see $LOGS/mlflow.log"; fi
        if (( SECONDS - t0 >= WAIT )); then stop; die "no /health answer within ${WAIT}s" "see $LOGS/mlflow.log; raise LABKIT_TEAM_WAIT"; fi
        sleep 0.5  # each probe is a Python start: more often would slow the server's own start
    done
    log "ready in $((SECONDS - t0)) s"
    url
}

stop() {
    if proxy_alive; then
        local ppid; ppid=$(cat "$PROXY_PID")
        kill -QUIT "$ppid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$ppid" 2>/dev/null || break; sleep 0.1; done  # 10 s
        kill -KILL "$ppid" 2>/dev/null || true
    fi
    rm -f "$PROXY_PID"
    if [ -f "$MLFLOW_PID" ]; then
        local pid; pid=$(cat "$MLFLOW_PID")
        # TERM the leader only: mlflow forwards it to uvicorn, which stops its workers in
        # order (TERM to the whole group races uvicorn into respawning workers). Then a
        # bounded wait for the whole group, then KILL whatever is left of it.
        kill -TERM "$pid" 2>/dev/null || kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 300); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done  # 30 s
        kill -KILL -- "-$pid" 2>/dev/null || true
        rm -f "$MLFLOW_PID"
    fi
    if pg_alive; then as_pg "$(pg_bin)/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null; fi
    log "stopped"
}

status() {
    local rc=0
    if mlflow_alive; then log "mlflow: pid $(cat "$MLFLOW_PID"), $(url)"; else log "mlflow: not running"; rc=3; fi
    if proxy_alive; then log "nginx (TLS): pid $(cat "$PROXY_PID")"; fi
    if pg_alive; then log "postgres: running, $DB_URI"; else log "postgres: not running"; rc=3; fi
    return $rc
}

# --- backup and restore ------------------------------------------------------------------------
# One archive, labkit-team-<UTC stamp>.tar.gz (mode 0600: it holds the users' password hashes
# and the admin password): mlflow.dump and mlflow_auth.dump (pg_dump -Fc: each one consistent
# snapshot, taken while the server runs), then artifacts.tar, auth.tar and tls.tar (a trial
# certificate clients already trust). The dumps come
# first: every artifact a dumped run had by then is in the tar. MANIFEST.json names the MLflow
# version and its database schema (alembic revision); SHA256SUMS covers every other member.
psql_q() { as_pg "$(pg_bin)/psql" -h "$RUN" -U labkit -d "$1" -tAc "$2"; }

backup() {
    local out=${1:-$DIR/backups} bin started=0 stamp
    bin=$(pg_bin)
    [[ $ARTIFACTS == *://* ]] && die "artifacts live in $ARTIFACTS, not in a folder here" \
        "back up that bucket with its own tools, and the database with pg_dump; this command covers local artifacts only"
    [ -f "$PGDATA/PG_VERSION" ] || die "no team server data in $DIR" "set LABKIT_TEAM_DIR to the server's folder"
    if ! pg_alive; then start_postgres; started=1; fi
    mkdir -p "$out"
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    STAGE=$(mktemp -d "$DIR/backup.XXXXXX"); local stage=$STAGE
    chmod 700 "$stage"
    trap 'rm -rf "$STAGE"' EXIT
    as_pg "$bin/pg_dump" -Fc -h "$RUN" -U labkit mlflow >"$stage/mlflow.dump"
    as_pg "$bin/pg_dump" -Fc -h "$RUN" -U labkit mlflow_auth >"$stage/mlflow_auth.dump"
    local schema; schema=$(psql_q mlflow "SELECT version_num FROM alembic_version" 2>/dev/null || true)
    [ "$started" = 1 ] && as_pg "$bin/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null
    tar -C "$ARTIFACTS" -cf "$stage/artifacts.tar" .
    if [ -d "$AUTH" ]; then tar -C "$AUTH" -cf "$stage/auth.tar" .; fi
    if [ -d "$DIR/tls" ]; then tar -C "$DIR/tls" -cf "$stage/tls.tar" .; fi  # a trial certificate clients trust
    (cd "$stage" && sha256sum -- *.dump *.tar >SHA256SUMS)
    "$PY" - "$stage" "$schema" "$stamp" <<'PY'
import json, sys
from importlib.metadata import version
stage, schema, stamp = sys.argv[1:]
json.dump({"format": "labkit-team-backup/1", "created": stamp, "mlflow": version("mlflow"),
           "schema": schema or None}, open(f"{stage}/MANIFEST.json", "w"), indent=1)
PY
    local archive=$out/labkit-team-$stamp.tar.gz
    # Written under another name, then renamed: an interrupted backup never looks like one.
    (umask 077; tar -C "$stage" -czf "$archive.partial" MANIFEST.json SHA256SUMS $(cd "$stage" && ls -- *.dump *.tar))
    mv "$archive.partial" "$archive"
    log "backup: $archive ($(du -h "$archive" | cut -f1); schema ${schema:-unknown})"
    echo "$archive"
}

# Restore into this LABKIT_TEAM_DIR, the server stopped. The archive is checked whole first
# (and a running server left running when it fails); what was there is moved aside to
# before-restore-<stamp>/, never deleted.
restore() {
    local archive=${1:-} force=${2:-}
    [ -n "$archive" ] || die "no archive named" "make team-server-restore ARCHIVE=path/to/labkit-team-….tar.gz"
    [ -f "$archive" ] || die "no such archive: $archive" "name a file made by make team-server-backup"
    [[ $ARTIFACTS == *://* ]] && die "artifacts live in $ARTIFACTS" "restore the bucket with its own tools; this command restores local artifacts only"
    STAGE=$(mktemp -d "${TMPDIR:-/tmp}/lkrestore.XXXXXX"); local stage=$STAGE
    trap 'rm -rf "$STAGE"' EXIT
    tar -C "$stage" -xzf "$archive" 2>"$stage/.err" ||
        die "$archive is truncated or not a gzip'd tar ($(tr '\n' ' ' <"$stage/.err" | head -c 160))" "use another backup; nothing was changed"
    [ -f "$stage/MANIFEST.json" ] && [ -f "$stage/SHA256SUMS" ] ||
        die "$archive is not a labkit team backup (no MANIFEST.json / SHA256SUMS)" "name a file made by make team-server-backup"
    (cd "$stage" && sha256sum --quiet -c SHA256SUMS) >"$stage/.err" 2>&1 ||
        die "$archive does not match its checksums: $(tr '\n' ' ' <"$stage/.err" | head -c 300)" "use another backup; nothing was changed"
    local want; want=$("$PY" - "$stage/MANIFEST.json" <<'PY'
import json, sys
from alembic.script import ScriptDirectory
from mlflow.store.db.utils import _get_alembic_config
m = json.load(open(sys.argv[1]))
revs = ScriptDirectory.from_config(_get_alembic_config("sqlite://"))
head = revs.get_current_head()
known = {r.revision for r in revs.walk_revisions()}
print("same" if m["schema"] == head else "older" if m["schema"] in known else "unknown " + m.get("mlflow", "?"))
PY
)
    case $want in
        same|older) ;;
        *) die "$archive holds a database of a newer or unknown MLflow schema (made with mlflow ${want#unknown })" \
               "restore it with that MLflow ($PY -m pip install mlflow==${want#unknown }, or LABKIT_MLFLOW=<its mlflow>); nothing was changed" ;;
    esac
    if mlflow_alive || pg_alive; then
        [ "$force" = --force ] || die "the team server on $DIR is running: restoring would replace its data under it" \
            "stop it first (make team-server-stop), or restore with --force (FORCE=1), which stops it and keeps its data aside"
        stop
    fi
    local aside; aside=$DIR/before-restore-$(date -u +%Y%m%dT%H%M%SZ)
    local what
    for what in "$PGDATA" "$ARTIFACTS" "$AUTH" "$DIR/tls"; do
        [ -e "$what" ] || continue
        mkdir -p "$aside"; mv "$what" "$aside/"
    done
    [ -d "$aside" ] && log "the data that was here is kept in $aside"
    start_postgres
    local bin; bin=$(pg_bin)
    local db
    for db in mlflow mlflow_auth; do
        as_pg "$bin/pg_restore" -h "$RUN" -U labkit -d "$db" --no-owner --exit-on-error <"$stage/$db.dump" ||
            { as_pg "$bin/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null
              die "pg_restore of $db failed" "see the messages above; the data that was here is in $aside"; }
    done
    as_pg "$bin/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null
    mkdir -p "$ARTIFACTS"; tar -C "$ARTIFACTS" -xf "$stage/artifacts.tar"
    if [ -f "$stage/auth.tar" ]; then
        (umask 077; mkdir -p "$AUTH"; tar -C "$AUTH" -xf "$stage/auth.tar")
        # the users' database is this folder's now, wherever the backup was made
        sed -i "s#^database_uri = .*#database_uri = $AUTH_DB_URI#" "$AUTH/auth.ini"
    fi
    if [ -f "$stage/tls.tar" ]; then (umask 077; mkdir -p "$DIR/tls"; tar -C "$DIR/tls" -xf "$stage/tls.tar"); fi
    if [ "$want" = older ]; then
        log "the backup's schema is older than this MLflow's: mlflow db upgrade"
        start_postgres
        "$MLFLOW" db upgrade "$DB_URI" >>"$LOGS/mlflow.log" 2>&1 || die "mlflow db upgrade failed" "see $LOGS/mlflow.log"
        as_pg "$bin/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null
    fi
    log "restored $archive into $DIR; start it with make team-server"
}

case "${1:-}" in
    start) start ;;
    backup) backup "${2:-}" ;;
    restore) restore "${2:-}" "${3:-}" ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status|backup [DIR]|restore ARCHIVE [--force]" >&2; exit 2 ;;
esac
