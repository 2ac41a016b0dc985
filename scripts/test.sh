#!/usr/bin/env bash
# The README's test command: installs what it needs (uv, nox, a venv per session) and runs the
# default nox sessions: lint, one test session per package, and the integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap-tools.sh
exec nox "$@"
