#!/usr/bin/env bash
# Build what a GPU machine without network needs to run nxd: our packages' wheels plus the
# third-party wheels its image lacks (pydantic, omegaconf, liger-kernel, torchtitan, torchao and their needs).
#   bash benchmarks/gpu/build_wheels.sh OUT_DIR
set -euo pipefail
source "$(dirname "$0")/../../scripts/bootstrap-tools.sh" 2>/dev/null || true
out=${1:?usage: build_wheels.sh OUT_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
for pkg in "$root"/registry "$root"/packages/*/; do
  "${UV:-uv}" build --wheel -q -o "$out" "$pkg"
done
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$out" \
  pydantic pydantic-core annotated-types typing-inspection omegaconf zlib-ng \
  liger-kernel torchtitan==0.2.2 torchdata datasets dill multiprocess tomli tyro docstring-parser typeguard shtab \
  torchao==0.18.0  # nxd-fp8 (FP8 training); the same version as constraints.txt
cp "$root"/benchmarks/bench_gpu.py "$root"/benchmarks/gpu/device_session.sh "$root"/benchmarks/gpu/trace_summary.py "$out"/
du -sh "$out"
