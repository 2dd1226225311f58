#!/bin/bash
# One prepared GPU check: a planned search, the cuda tests, doctor.
cd "$(dirname "$0")/../.."  # the repo root; wheels of what the image lacks in .whl/
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$root HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, transformers, optuna, datasets; print(torch.__version__, transformers.__version__, optuna.__version__, datasets.__version__)" | tee -a $OUT/gpu.txt
mkdir -p /tmp/s && cd /tmp/s
( time timeout 230 python3 -m autotune search --model google/mt5-small --global-batch-size 64 --seq-len 256 --target-len 64 --time-budget 3m --quiet ) 2>&1 | tee $OUT/search.log
python3 -m autotune show --study mt5-small --format json > $OUT/show.json 2>&1
cd "$root"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m cuda tests/probe 2>&1 | tee $OUT/cuda.log
timeout 100 python3 -m autotune doctor 2>&1 | tee $OUT/doctor.log
