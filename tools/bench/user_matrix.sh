#!/usr/bin/env bash
# The user-model benchmark of docs/benchmarks.md on the GPU machine, from a staged cuda payload: the same model
# source (tools/bench/user_models.py) under infinitrain (eager and it.compile) and PyTorch (eager and
# torch.compile), nanoGPT-style GPT and LLaMA-style decoder, small and 124M, one after another on one card; each
# configuration REPS times (default 1; the table takes medians). JSON lines on standard output.
#   source .device/env.sh && REPS=2 bash tools/bench/user_matrix.sh [modes] [sizes] [models]
set -u
P=${PAYLOAD:-.device/payload/cuda}
MODES=${1:-eager compile}
SIZES=${2:-small 124m}
MODELS=${3:-gpt llama}
REPS=${REPS:-1}
export PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=$PWD/$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >&2
for size in $SIZES; do
    for model in $MODELS; do
        for mode in $MODES; do
            for _ in $(seq "$REPS"); do
                PYTHONPATH=$PWD/$P/python timeout 150 python3.11 tools/bench/user_models.py --framework infinitrain \
                    --model "$model" --size "$size" --mode "$mode" 2>&1 | tail -1
                timeout 200 python3 tools/bench/user_models.py --framework torch --model "$model" --size "$size" \
                    --mode "$mode" 2>&1 | tail -1
            done
        done
    done
done
