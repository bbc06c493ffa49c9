#!/usr/bin/env bash
# Builds tools/foreach_check/foreach_check (static cudart, sm_90): the multi-tensor kernels' check on a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA="${CUDA_HOME:-/usr/local/cuda}"
NVCC="${NVCC:-$CUDA/bin/nvcc}"
"$NVCC" -O3 -std=c++17 -arch=sm_90 -I. -I"$CUDA/include" \
    -DINFINITRAIN_GPU_VENDOR_HEADER='"backends/cuda/vendor_cuda.h"' \
    -cudart static tools/foreach_check/foreach_check.cu -o tools/foreach_check/foreach_check
echo "built tools/foreach_check/foreach_check"
