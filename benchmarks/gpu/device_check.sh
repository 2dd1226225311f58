#!/bin/bash
# One prepared GPU check (about 9.5 minutes, run it with timeout_s 590): a QLoRA factory
# search, the cuda tests, doctor, then the README's main job on a short budget. Wheels
# of what the image lacks travel in .whl/ (carry it: optuna, optuna-dashboard, bottle,
# alembic, mako, colorlog, sqlalchemy, datasets, dill, multiprocess, transformers, peft,
# trl, bitsandbytes with its other CUDA builds zipped out); each step's output lands in
# $OUT. On 2026-11-27 the cuda tests needed more than 170 s on an H100 and doctor more
# than 45 s: the limits below leave them room.
cd "$(dirname "$0")/../.."  # the repo root
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$root HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, transformers, optuna, datasets, pyarrow, peft, trl, bitsandbytes as b; print(torch.__version__, transformers.__version__, optuna.__version__, datasets.__version__, pyarrow.__version__, peft.__version__, trl.__version__, b.__version__)" 2>&1 | tee -a $OUT/gpu.txt
# QLoRA as users run it: the bf16 checkpoint in 4-bit NF4 on the GPU, SFTTrainer, 20 GiB
export TMPDIR=/tmp/jobs && mkdir -p $TMPDIR
( time timeout 110 python3 benchmarks/jobs.py --device cuda --budget 20GiB --jobs qlora --time-budget 1m --no-append ) > $OUT/qlora.log 2>&1
( cd $TMPDIR/autotune-jobs-* && cp qlora.search.log $OUT/ ; python3 -m autotune show --study qlora ) > $OUT/qlora_show.txt 2>&1
unset TMPDIR
timeout 240 python3 -m pytest -q -p no:cacheprovider -m cuda tests/probe > $OUT/cuda.log 2>&1
timeout 120 python3 -m autotune doctor > $OUT/doctor.log 2>&1
mkdir -p /tmp/s && cd /tmp/s
( time timeout 95 python3 -m autotune search --model google/mt5-small --global-batch-size 64 --seq-len 256 --target-len 64 --time-budget 1m --quiet ) > $OUT/search.log 2>&1
tail -n 3 $OUT/*.log
