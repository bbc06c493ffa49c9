#!/usr/bin/env bash
# Builds tools/flash_check/flash_check (static cudart, sm_90) and compile-checks flash_attention.cuh under a vendor
# header without TileMma (MACA's policy choice). PTXAS_V=1 prints register and shared-memory use.
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA="${CUDA_HOME:-/usr/local/cuda}"
NVCC="${NVCC:-$CUDA/bin/nvcc}"
COMMON=(-O3 -std=c++17 -arch=sm_90 -I. -I"$CUDA/include")
VERBOSE=()
if [[ "${PTXAS_V:-0}" == 1 ]]; then VERBOSE=(-Xptxas -v); fi
"$NVCC" "${COMMON[@]}" "${VERBOSE[@]}" -DINFINITRAIN_GPU_VENDOR_HEADER='"backends/cuda/vendor_cuda.h"' \
    -cudart static tools/flash_check/flash_check.cu -o tools/flash_check/flash_check
OBJ="$(mktemp -d)"
trap 'rm -rf "$OBJ"' EXIT
"$NVCC" "${COMMON[@]}" -DINFINITRAIN_GPU_VENDOR_HEADER='"tools/flash_check/vendor_no_tile_mma.h"' \
    -c tools/flash_check/simt_only.cu -o "$OBJ/simt_only.o"
echo "built tools/flash_check/flash_check"
