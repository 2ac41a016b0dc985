#!/usr/bin/env bash
# One measurement session on a lent GPU machine (no network): install the carried wheels, then run
# the steps named in $STEPS (default: all), each under its own time limit, logs under $OUT.
#   STEPS="tests train bench-compiled" bash .whl/device_session.sh
# Steps: tests (pytest -m gpu), train (nxd train hub:llama3.2-1b compiled and eager; train-fp8 adds
# precision.type=fp8), bench-compiled, bench-eager (benchmarks/bench_gpu.py), issue 35's: mfu (nxd
# train's step vs torchtitan's recipe vs the bare model, same process), fp8 (bf16-autocast vs FP8
# tensorwise/rowwise tokens/s at the 1B and 8B-layer shapes), fp8-loss (200-step loss curves, bf16 vs
# FP8), moe (experts: grouped GEMM vs loop); extra (any script .whl/extra.sh).
#   issue 35 in one call: STEPS="mfu fp8 fp8-loss moe train-fp8" bash .whl/device_session.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$(mktemp -d)}
STEPS=${STEPS:-tests train bench-compiled bench-eager}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$here"/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, triton, liger_kernel, nxd; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -c "import torchao; print('torchao', torchao.__version__)" 2>/dev/null | tee -a "$OUT/gpu.txt"; date -u | tee -a "$OUT/gpu.txt"
has() { [[ " $STEPS " == *" $1 "* ]]; }
train() {  # name, max_steps, extra overrides...
  local name=$1 steps=$2; shift 2
  local dir; dir=$(mktemp -d)
  timeout 240 python3 -m nxd.cli train hub:llama3.2-1b trainer.max_steps="$steps" trainer.enable_progress_bar=false \
    exp_manager.exp_dir="$dir" "$@" > "$OUT/train-$name.log" 2>&1
  echo "train-$name exit $?"
  cp "$dir"/llama3.2-1b/version_0/metrics.jsonl "$OUT/train-$name.jsonl" 2>/dev/null
  python3 - "$OUT/train-$name.jsonl" "$name" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
rows = [r for r in rows if "step_time_s" in r][5:]  # skip warm-up / compile steps
if rows:
    med = lambda k: statistics.median(r[k] for r in rows if k in r)
    print(f"nxd train {sys.argv[2]}: {len(rows)} steps, step {med('step_time_s'):.4f} s, "
          f"{med('tokens_per_s'):.0f} tokens/s, MFU {med('mfu'):.1%}, peak {max(r['peak_memory_mb'] for r in rows)/1024:.2f} GiB")
PY
}
if has tests; then
  timeout 300 python3 -m pytest -m gpu packages/nxd-training/tests/test_gpu.py packages/nxd-models-llama/tests/test_fused_kernels.py \
    packages/nxd-ckpt/tests/test_gpu_snapshots.py \
    -q -s -p no:cacheprovider \
    2>&1 | tee "$OUT/tests.log" | tail -5
fi
if has train; then
  train compiled 30
  train compiled-fusedce 30 "model.fused_kernels=[cross_entropy]"
  has train-eager && train eager 15 trainer.compile=false
fi
if has bench-compiled; then
  timeout 480 python3 "$here"/bench_gpu.py --only "${BENCH_COMPILED:-nxd-compiled,nxd-compiled-fusedce,hf-compiled,torchtitan-compiled}" --json "$OUT/bench-compiled.json" \
    2>&1 | tee "$OUT/bench-compiled.log" | tail -8
fi
if has bench-eager; then
  timeout 300 python3 "$here"/bench_gpu.py --only "${BENCH_EAGER:-nxd-eager,nxd-fused,hf-eager,torchtitan-eager}" --json "$OUT/bench-eager.json" \
    2>&1 | tee "$OUT/bench-eager.log" | tail -8
fi
bench() {  # name, time limit, bench_gpu.py arguments...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 "$here"/bench_gpu.py "$@" --json "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log" | tail -8
}
if has train-fp8; then
  train fp8 30 precision.type=fp8
fi
if has mfu; then  # issue 35: nxd train's own step is in train-compiled's log; these are its peers, side by side
  bench mfu 300 --only nxd-compiled,torchtitan-recipe,torchtitan-compiled --steps 15
fi
if has fp8; then
  bench fp8-1b 240 --only nxd-compiled-amp,nxd-compiled-fp8,nxd-compiled-fp8-rowwise --steps 15
  bench fp8-8b-layer 240 --shape 8b-layer --only nxd-compiled-amp,nxd-compiled-fp8,nxd-compiled-fp8-rowwise --steps 10
fi
if has fp8-loss; then
  bench fp8-loss 420 --loss-steps 200 --only nxd-compiled-amp,nxd-compiled-fp8
fi
if has moe; then
  bench moe 120 --moe --steps 10
fi
if has extra && [ -f "$here/extra.sh" ]; then
  bash "$here/extra.sh"
fi
for f in "$OUT"/train-*.log; do echo "== $f"; tail -3 "$f"; done
