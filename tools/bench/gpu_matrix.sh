#!/usr/bin/env bash
# The GPU benchmark matrix of docs/benchmarks.md, on the GPU machine from a staged cuda payload: GPT-2 124M and
# LLaMA 3 ~125M at B=16, GPT-2 XL and LLaMA 3.2-1B's shape at B=8 (T=1024), infinitrain (bench_gpu) then PyTorch
# eager+SDPA and torch.compile+SDPA (tools/bench/torch_models.py under the machine's own python3), one after
# another on the same card; JSON lines, then the table with both ratios (tools/bench/matrix_table.py).
#   source .device/env.sh && bash tools/bench/gpu_matrix.sh [payload dir] [rows, e.g. "gpt2:16 gpt2-xl:8"]
set -u
P=${1:-.device/payload/cuda}
ROWS=${2:-gpt2:16 llama3:16 gpt2-xl:8 llama3-1b:8}
export PYTHONUNBUFFERED=1
log=$(mktemp)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >&2
for row in $ROWS; do
    m=${row%:*} b=${row#*:}
    PYTHONPATH=$PWD/$P/python timeout 200 python3.11 -m infinitrain.tools.bench_gpu --device=cuda --model="$m" \
        --batch="$b" 2>&1 | tail -1 | tee -a "$log"
    for mode in eager compile; do
        timeout 300 python3 tools/bench/torch_models.py --model "$m" --batch "$b" --mode $mode 2>&1 | tail -1 |
            tee -a "$log"
    done
done
python3 tools/bench/matrix_table.py <"$log"
