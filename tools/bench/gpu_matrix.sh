#!/usr/bin/env bash
# The GPU benchmark matrix of docs/benchmarks.md, on the GPU machine from a staged cuda payload: GPT-2 124M and
# LLaMA 3 ~125M at B=16 and 32, infinitrain (bench_gpu) then PyTorch eager+SDPA and torch.compile+SDPA
# (tools/bench/torch_models.py under the machine's own python3), one after another on the same card.
#   source .device/env.sh && bash tools/bench/gpu_matrix.sh [payload dir, default .device/payload/cuda]
set -u
P=${1:-.device/payload/cuda}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for m in gpt2 llama3; do
    for b in 16 32; do
        PYTHONPATH=$PWD/$P/python python3.11 -m infinitrain.tools.bench_gpu --device=cuda --model=$m --batch=$b 2>&1 | tail -1
        python3 tools/bench/torch_models.py --model $m --batch $b --mode eager 2>&1 | tail -1
        python3 tools/bench/torch_models.py --model $m --batch $b --mode compile 2>&1 | tail -1
    done
done
