#!/usr/bin/env bash
# The README's main command: install what is needed (uv into .tools/, the nxd packages into a venv)
# and train a tiny Llama with TP=2 on 2 CPU ranks on the embedded corpus. Writes TensorBoard logs,
# metrics.jsonl, a loss-curve PNG and checkpoints under nxd_experiments/quickstart/version_N/,
# then prints generated samples. Extra arguments are config overrides (e.g. trainer.max_steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap-tools.sh

PACKAGES=(./registry ./packages/nxd-core-parallel ./packages/nxd-tensor-parallel
          ./packages/nxd-context-parallel ./packages/nxd-modeling ./packages/nxd-ckpt ./packages/nxd-data
          ./packages/nxd-models-llama ./packages/nxd-training)
if [ -x .venv/bin/python ] && .venv/bin/python -c "import nxd_training, nxd_data, nxd_models_llama, nxd_ckpt" 2>/dev/null; then
  VENV=.venv                      # the dev environment already has everything (editable)
else
  VENV=.venv-quickstart
  "$UV" venv -q --allow-existing "$VENV"
  echo "quickstart: installing nxd into $VENV ..."
  "$UV" pip install -q --python "$VENV/bin/python" -c constraints.txt "${PACKAGES[@]}"
fi

export OMP_NUM_THREADS=1
start=$(date +%s)
"$VENV/bin/nxd" train hub:quickstart exp_manager.exp_dir=nxd_experiments "$@"
end=$(date +%s)

run=$(ls -dt nxd_experiments/quickstart/*/ | head -1)
"$VENV/bin/nxd" plot "$run" -o "${run}loss.png"
"$VENV/bin/python" - "$run" "$((end - start))" <<'PY'
import sys
from nxd_training.exp_manager import read_metrics

run, wall = sys.argv[1], int(sys.argv[2])
train = read_metrics(run)
valid = read_metrics(run, "valid")
first, last = train[0], train[-1]
print(f"\nquickstart: loss {first['loss']:.3f} (step {first['step']}) -> {last['loss']:.3f} (step {last['step']})"
      + (f", validation loss {valid[-1]['loss']:.3f}" if valid else ""))
print(f"quickstart: {wall} s wall time, {last['tokens_per_s']:.0f} tokens/s at the end")
print(f"quickstart: run directory {run} (tensorboard --logdir {run}; loss curve {run}loss.png; checkpoints {run}checkpoints/)")
PY
