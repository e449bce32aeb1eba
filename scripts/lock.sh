#!/usr/bin/env bash
# Regenerate requirements/constraints.txt from the current venv (after changing pyproject).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LABKIT_VENV:-.venv}
{
  echo "# Exact versions of every dependency, transitive included; regenerate with scripts/lock.sh"
  "$VENV/bin/pip" freeze --exclude-editable | grep -v -i -E '^(labkit|llama.cpp.python)[=@ ]' | sort -f
} > requirements/constraints.txt
