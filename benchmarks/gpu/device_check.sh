#!/bin/bash
# One prepared GPU check (about 9 minutes): a QLoRA factory search, the cuda tests,
# doctor, and the README's main job on a short budget. Wheels of what the image lacks
# travel in .whl/ (carry it); each step's output lands in $OUT.
cd "$(dirname "$0")/../.."  # the repo root
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$root HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, transformers, optuna, datasets, pyarrow, peft, trl, bitsandbytes as b; print(torch.__version__, transformers.__version__, optuna.__version__, datasets.__version__, pyarrow.__version__, peft.__version__, trl.__version__, b.__version__)" 2>&1 | tee -a $OUT/gpu.txt
# QLoRA as users run it: the bf16 checkpoint in 4-bit NF4 on the GPU, SFTTrainer, 20 GiB
export TMPDIR=/tmp/jobs && mkdir -p $TMPDIR
( time timeout 200 python3 benchmarks/jobs.py --device cuda --budget 20GiB --jobs qlora --time-budget 2m --no-append ) > $OUT/qlora.log 2>&1
( cd $TMPDIR/autotune-jobs-* && python3 -m autotune show --study qlora ) > $OUT/qlora_show.txt 2>&1
unset TMPDIR
timeout 170 python3 -m pytest -q -p no:cacheprovider -m cuda tests/probe > $OUT/cuda.log 2>&1
timeout 45 python3 -m autotune doctor > $OUT/doctor.log 2>&1
mkdir -p /tmp/s && cd /tmp/s
( time timeout 150 python3 -m autotune search --model google/mt5-small --global-batch-size 64 --seq-len 256 --target-len 64 --time-budget 2m --quiet ) > $OUT/search.log 2>&1
python3 -m autotune show --study mt5-small > $OUT/show.txt 2>&1
tail -3 $OUT/*.log
