#!/bin/bash
# One prepared GPU check. Its steps, each with its own limit and its output in $OUT:
#   qlora   a QLoRA factory search at 1 minute (benchmarks/jobs.py)       ~110 s
#   padfree the same job on flex attention, samples of 50-1700 tokens:     ~210 s
#           padding-free batches searched where they can pay (3 minutes)
#   cuda    the cuda tests ($CUDA_TESTS, default tests/probe)               ~240 s
#   doctor  autotune doctor                                                 ~60 s
#   levels  graded checkpointing where memory binds, the search alone       ~200 s
#           (benchmarks/checkpoint_levels.py --budget auto)
#   mt5     the README's main job on a 1-minute budget                      ~95 s
#   mfu     the pick's MFU beside the plain default's and a hand-set       ~340 s
#           config's: LoRA on a 1.24B Llama at 2048 tokens                 (H200, 2026-11-30)
#           (benchmarks/mfu.py --record)
#   mfu-full  the same, full fine-tuning                                   ~260 s
#   mfu-fp32  LoRA again, the search given fp32 AdamW (the Trainer's        ~340 s
#           defaults): the export keeps fp32 unless paired rounds confirm    (not yet run)
#           bf16, weighed against fp32 made to fit
# STEPS picks them (default: all but the mfu steps, about 16 minutes: more than one
# call may run); e.g.
#   STEPS="cuda qlora levels" CUDA_TESTS="tests/probe/test_cuda_checkpointing.py" \
#       bash benchmarks/gpu/device_check.sh
# Wheels of what the image lacks travel in .whl/ (carry it), which benchmarks/gpu/wheels.sh
# fills here: optuna, optuna-dashboard, bottle, alembic, mako, colorlog, sqlalchemy,
# datasets, dill, multiprocess, transformers, peft, trl, bitsandbytes with its other CUDA
# builds zipped out, and liger-kernel (mfu's hand-set config; left out where not carried).
cd "$(dirname "$0")/../.."  # the repo root
root=$PWD
steps=" ${STEPS:-qlora padfree cuda doctor levels mt5} "
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$root HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, transformers, optuna, datasets, pyarrow, peft, trl, bitsandbytes as b; print(torch.__version__, transformers.__version__, optuna.__version__, datasets.__version__, pyarrow.__version__, peft.__version__, trl.__version__, b.__version__)" 2>&1 | tee -a $OUT/gpu.txt
if [[ $steps == *" cuda "* ]]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m cuda ${CUDA_TESTS:-tests/probe} > $OUT/cuda.log 2>&1
fi
if [[ $steps == *" qlora "* ]]; then  # QLoRA as users run it: 4-bit NF4 on the GPU, SFTTrainer
  export TMPDIR=/tmp/jobs && mkdir -p $TMPDIR
  ( time timeout 110 python3 benchmarks/jobs.py --device cuda --budget 20GiB --jobs qlora --time-budget 1m --work $TMPDIR/work ) > $OUT/qlora.log 2>&1
  ( cd $TMPDIR/work && cat qlora.search.log >> $OUT/qlora.log ; python3 -m autotune show --study qlora ) > $OUT/qlora_show.txt 2>&1
  unset TMPDIR
fi
if [[ $steps == *" padfree "* ]]; then  # where padding-free batches can pay: flex attention
  export TMPDIR=/tmp/padfree && mkdir -p $TMPDIR
  ( time timeout 230 python3 benchmarks/jobs.py --device cuda --budget 20GiB --jobs qlora --long --attention flex_attention --time-budget 3m --work $TMPDIR/work ) > $OUT/padfree.log 2>&1
  ( cd $TMPDIR/work && cat qlora.search.log >> $OUT/padfree.log ; python3 -m autotune show --study qlora ) > $OUT/padfree_show.txt 2>&1
  unset TMPDIR
fi
if [[ $steps == *" levels "* ]]; then  # a GPT-2 shape at 8192 tokens: one sample binds
  ( time timeout 230 python3 benchmarks/checkpoint_levels.py --device cuda --layers 12 --hidden 768 --heads 12 --seq-len 8192 --global-batch 8 --precision bf16 --budget auto --time-budget 2m --search-only ) > $OUT/levels.log 2>&1
fi
if [[ $steps == *" doctor "* ]]; then
  timeout 120 python3 -m autotune doctor > $OUT/doctor.log 2>&1
fi
if [[ $steps == *" mfu "* ]]; then  # #68: the table for benchmarks/RESULTS.md comes back
  ( time timeout 570 python3 benchmarks/mfu.py --device cuda --modes lora --record ) > $OUT/mfu.log 2>&1
  cp benchmarks/mfu.json $OUT/mfu_lora.json 2>/dev/null
fi
if [[ $steps == *" mfu-full "* ]]; then
  ( time timeout 570 python3 benchmarks/mfu.py --device cuda --modes full --record ) > $OUT/mfu_full.log 2>&1
  cp benchmarks/mfu.json $OUT/mfu_full.json 2>/dev/null
fi
if [[ $steps == *" mfu-fp32 "* ]]; then
  ( time timeout 570 python3 benchmarks/mfu.py --device cuda --modes lora --recipe fp32 ) > $OUT/mfu_fp32.log 2>&1
fi
if [[ $steps == *" mt5 "* ]]; then
  mkdir -p /tmp/s && cd /tmp/s
  timeout 95 python3 $root/benchmarks/stamped.py python3 -m autotune search --model google/mt5-small --global-batch-size 64 --seq-len 256 --target-len 64 --time-budget 1m --quiet > $OUT/search.log 2>&1
fi
tail -n 3 $OUT/*.log
