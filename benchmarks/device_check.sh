#!/usr/bin/env bash
# One-GPU check of benchmarks/bench_precision.py: mixed precision (float32,
# mixed_bfloat16, mixed_float16 with dynamic loss scaling) and XLA,
# HighPerfTrainer vs the stock Trainer vs a hand-tuned model.fit, on the MLP
# and the Transformer families, batches sized for a GPU, one round.
#
#     bash benchmarks/device_check.sh [extra bench_precision flags]
#
# Run from anywhere (it works in the repository root). Writes
# ${OUT:-benchmarks/results}/precision_gpu.md, with the run's log and raw
# results next to it. Takes about 6 minutes: the benchmark starts no
# measurement after DEVICE_CHECK['time_budget_s'] (330 s) and writes what
# it measured; `timeout` is only a backstop against a hang.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# The project venv, else a Python that already has TFX, else `make venv`.
if [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
elif command -v python3 >/dev/null 2>&1 &&
     python3 -c 'import tfx, tensorflow, tf_keras' >/dev/null 2>&1; then
  PY=python3
else
  make venv
  PY=.venv/bin/python
fi

OUT_DIR="${OUT:-benchmarks/results}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/precision_gpu.log"
{
  echo "# $(date -Is) $(uname -n)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
    2>/dev/null || echo "nvidia-smi: not available"
  "$PY" -c 'import tensorflow as tf; print("TensorFlow", tf.__version__,
    tf.config.list_physical_devices("GPU"))'
  # The lock's TensorFlow finds a GPU only with the CUDA libraries of
  # `tensorflow[and-cuda]==2.16.2` installed; without them this is a CPU run.
  "$PY" -c 'import sys, tensorflow as tf
sys.exit(0 if tf.config.list_physical_devices("GPU") else 1)' ||
    echo "WARNING: TensorFlow sees no GPU: the report is a CPU run."
} 2>&1 | tee "$LOG"

timeout 450 "$PY" -m benchmarks.bench_precision --device-check \
  --results-dir "$OUT_DIR" \
  --save-results "$OUT_DIR/precision_gpu_results.json" "$@" 2>&1 |
  tee -a "$LOG"
echo "report: $OUT_DIR/precision_gpu.md"
