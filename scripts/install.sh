#!/usr/bin/env bash
# Install nxd with every plugin from this checkout (PyPI's `nxd` is an unrelated project: nxd is
# installed from these folders), pinned by constraints.txt.
#   bash scripts/install.sh                            # creates .venv-nxd with the core and every plugin
#   bash scripts/install.sh --python ~/env/bin/python  # into an existing environment instead
#   bash scripts/install.sh --with-compat              # also nxd-compat (the `neuronx_distributed` import name)
# nxd-testing (a pytest plugin) and nxd-compat (opt-in: it takes NxD's import name) are left out unless named.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap-tools.sh

PYTHON="" ; EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PYTHON="$2"; shift 2 ;;
    --with-compat) EXTRA+=(./packages/nxd-compat); shift ;;
    --with-testing) EXTRA+=(./packages/nxd-testing); shift ;;
    *) echo "install.sh: unknown argument $1 (--python PATH, --with-compat, --with-testing)" >&2; exit 2 ;;
  esac
done
if [ -z "$PYTHON" ]; then
  "$UV" venv -q --allow-existing .venv-nxd
  PYTHON=.venv-nxd/bin/python
fi
PACKAGES=(./registry)
for pkg in packages/*/; do
  case "$pkg" in packages/nxd-compat/|packages/nxd-testing/) continue ;; esac
  PACKAGES+=("./${pkg%/}")
done
"$UV" pip install -q --python "$PYTHON" -c constraints.txt "${PACKAGES[@]}" "${EXTRA[@]}"
echo "installed nxd and $((${#PACKAGES[@]} - 1 + ${#EXTRA[@]})) plugins into $("$PYTHON" -c 'import sys; print(sys.prefix)'); check with: nxd plugins"
