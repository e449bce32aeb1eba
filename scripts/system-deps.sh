#!/usr/bin/env bash
# Install the Debian packages the test suite needs beyond Python:
#   chromium, chromium-driver  headless browser tests (selenium drives /usr/bin/chromium)
#   libopenblas0-pthread       fast BLAS preloaded for MLX (its wheel's reference BLAS is slow)
#   postgresql                 the team server's database (scripts/team-server.sh)
#   nginx-light, openssl       the team server's TLS proxy and its self-signed trial certificate
#   cmake, g++                 the one llama.cpp build of scripts/setup.sh (engines/native.py)
#   ninja-build                that build's generator when present (Make otherwise, ~10% slower)
#   texlive-latex-base, texlive-latex-recommended, poppler-utils
#                              pdflatex (booktabs, array, longtable) to check `labkit export --format latex`
#                              compiles, pdftoppm to render it (tests/test_export.py)
# Idempotent and fast: `dpkg -s` first; apt runs only when something is missing.
# Without root (and without passwordless sudo) it prints the command to run and exits 0,
# so `make test` can go on and the tests that need a package skip with their own message.
set -euo pipefail

PKGS=(cmake g++ ninja-build chromium chromium-driver libopenblas0-pthread postgresql nginx-light openssl texlive-latex-base texlive-latex-recommended poppler-utils)

log() { printf '[system-deps] %s\n' "$*" >&2; }

if ! command -v dpkg >/dev/null 2>&1; then
    log "not a Debian/Ubuntu system; install by hand: ${PKGS[*]} (or their equivalents)"
    exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
    # `dpkg -s` also succeeds for removed-but-configured packages; check the status line.
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    log "all present: ${PKGS[*]}"
    exit 0
fi

cmd=(apt-get install -y --no-install-recommends "${missing[@]}")
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif sudo -n true 2>/dev/null; then
    SUDO=(sudo)
else
    log "missing: ${missing[*]}; not root, so not installing. Run:"
    printf 'sudo apt-get update && sudo %s\n' "${cmd[*]}"
    exit 0
fi

log "installing: ${missing[*]}"
# noninteractive: tzdata/postgresql-common must not stop at a debconf prompt in CI.
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive "${cmd[@]}" -qq >/dev/null
log "installed: ${missing[*]}"
