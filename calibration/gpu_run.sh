#!/usr/bin/env bash
# The one prepared GPU calibration (at most 5 minutes on one GPU): the standard set for Llama-3.1-8B's
# shapes at TP 1, 2, 4 and 8, written to calibration/profiles/<name>-measured.yaml, then --check, which
# re-measures the held-out shapes and prints the prediction error per op.  Logs go next to the profile.
#
#   bash calibration/gpu_run.sh                    # needs torch with CUDA (pip install torch==2.13.0)
#   NAME=h100-sxm bash calibration/gpu_run.sh      # another GPU: the datasheet preset is picked by GPU name
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
NAME=${NAME:-h200}
OUT=calibration/profiles/${NAME}-measured.yaml
LOG=calibration/profiles/${NAME}-measured
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

$PY - <<'PY'
import torch, sys
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), file=sys.stderr)
if not torch.cuda.is_available():
    sys.exit("no CUDA GPU visible to torch")
print(torch.cuda.get_device_name(0), file=sys.stderr)
PY
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv || true

start=$(date +%s)
timeout 240 $PY -m pdsim calibrate --device cuda --model llama-3.1-8b --tp 1,2,4,8 --out "$OUT" \
    2> >(tee "$LOG.stderr.log" >&2) | tee "$LOG.calibrate.log"
timeout 60 $PY -m pdsim calibrate --check "$OUT" --quiet | tee "$LOG.check.log"
# the datasheet preset against the measured one on a few end-to-end steps
for dev in "$NAME" "$OUT"; do
  $PY -m pdsim estimate --model llama-3.1-8b --device "$dev" --prefill 2048 | head -1
  $PY -m pdsim estimate --model llama-3.1-8b --device "$dev" --decode-batch 32 --context 2048 | head -1
done | tee "$LOG.estimate.log"
echo "gpu_run.sh done in $(( $(date +%s) - start )) s" >&2
