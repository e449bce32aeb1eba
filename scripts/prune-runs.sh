#!/usr/bin/env bash
# Keep the newest N reproduction folders in runs/ and delete the rest.
#   LABKIT_KEEP_RUNS  how many to keep (default 30)
#   LABKIT_RUNS_DIR   the folder (default <repo>/runs)
# Only folders named like `labkit reproduce` names them (YYYYmmdd-HHMMSS-<recipe>-<token>) are
# touched, newest by name (the stamp sorts in time order; mtimes change when a folder is
# read back or regenerated into). runs/regen and anything else stays. MLflow keeps the
# runs themselves; the comparison with the previous run reads MLflow, not these folders.
# Also rotates runs/reproduce.log (the cron log) past LABKIT_LOG_MAX_KB (default 10240).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${LABKIT_RUNS_DIR:-$REPO/runs}
KEEP=${LABKIT_KEEP_RUNS:-30}
# at least 1: the newest folder may belong to a reproduction that is still running
[[ $KEEP =~ ^[0-9]+$ && $KEEP -ge 1 ]] || {
    echo "[prune-runs] LABKIT_KEEP_RUNS must be a whole number >= 1, got '$KEEP'" >&2; exit 2; }
[ -d "$RUNS" ] || exit 0

mapfile -t old < <(find "$RUNS" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
    -regex '.*/[0-9]{8}-[0-9]{6}-[^/]+' -printf '%f\n' | sort -r | tail -n +"$((KEEP + 1))")
for name in "${old[@]}"; do rm -rf -- "${RUNS:?}/$name"; done
echo "[prune-runs] kept newest $KEEP, removed ${#old[@]} from $RUNS" >&2

logf=$RUNS/reproduce.log
if [ -f "$logf" ] && [ "$(du -k "$logf" | cut -f1)" -gt "${LABKIT_LOG_MAX_KB:-10240}" ]; then
    mv -f "$logf" "$logf.1"
fi
