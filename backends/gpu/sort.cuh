// sort: each row of x (the last dim) ascending or descending, with int64 source positions. The order is total:
// NaN is the largest value, and equal values keep their positions' order, so the result equals a stable sort
// (the CPU's) bit for bit.
//
// Layout: a block per row (grid-stride over rows) runs a bitonic network over m = the next power of two >= n
// (key, position) pairs; positions >= n are padding that sorts after everything. Rows whose pairs fit in 48 KiB
// of shared memory sort there; longer rows sort in a global scratch of m pairs a row, the block's barriers
// ordering the network's steps. Keys are the compute type (float for 16-bit dtypes: exact).
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

constexpr int64_t kSortSharedBytes = 48 * 1024;

// Whether (ka, ia) comes before (kb, ib) in the requested order.
template <typename K>
__device__ __forceinline__ bool SortBefore(K ka, int ia, K kb, int ib, int n, bool descending) {
    if (ia >= n) return false;
    if (ib >= n) return true;
    const bool a_nan = isnan(ka), b_nan = isnan(kb);
    const bool a_lt = b_nan ? !a_nan : ka < kb;  // NaN largest
    const bool b_lt = a_nan ? !b_nan : kb < ka;
    const bool first = descending ? b_lt : a_lt;
    const bool tie = !a_lt && !b_lt;
    return first || (tie && ia < ib);
}

// The bitonic network over m pairs in key[] / pos[] (shared or global), run by the whole block.
template <typename K>
__device__ void BitonicSort(K* key, int* pos, int m, int n, bool descending) {
    for (int k = 2; k <= m; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int p = threadIdx.x; p < m / 2; p += blockDim.x) {
                const int i = 2 * p - (p & (j - 1));
                const int l = i + j;
                const bool up = (i & k) == 0;  // this segment in the requested order, else reversed
                const bool swap = up ? SortBefore(key[l], pos[l], key[i], pos[i], n, descending)
                                     : SortBefore(key[i], pos[i], key[l], pos[l], n, descending);
                if (swap) {
                    const K tk = key[i];
                    key[i] = key[l];
                    key[l] = tk;
                    const int tp = pos[i];
                    pos[i] = pos[l];
                    pos[l] = tp;
                }
            }
            __syncthreads();
        }
    }
}

// scratch_key / scratch_pos: m per row of this block's grid slot when not sorting in shared memory (nullptr then).
template <typename T>
__global__ void SortRowsKernel(const T* __restrict__ x, T* __restrict__ values, int64_t* __restrict__ indices,
                               int64_t rows, int n, int m, bool descending, Acc<T>* scratch_key, int* scratch_pos) {
    using K = Acc<T>;
    extern __shared__ unsigned char smem[];
    K* key = scratch_key ? scratch_key + static_cast<int64_t>(blockIdx.x) * m : reinterpret_cast<K*>(smem);
    int* pos = scratch_pos ? scratch_pos + static_cast<int64_t>(blockIdx.x) * m : reinterpret_cast<int*>(key + m);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * n;
        for (int j = threadIdx.x; j < m; j += blockDim.x) {
            key[j] = j < n ? ToAcc(xr[j]) : K(0);
            pos[j] = j;
        }
        __syncthreads();
        BitonicSort(key, pos, m, n, descending);
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            values[r * n + j] = xr[pos[j]];
            indices[r * n + j] = pos[j];
        }
        __syncthreads();  // the next row rewrites key and pos
    }
}

}  // namespace infinitrain::gpu
