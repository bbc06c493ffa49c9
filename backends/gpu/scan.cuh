// cumsum: inclusive prefix sums along one dim (reverse: suffix sums, the backward).
//
// Layout: x contiguous [outer, n, inner] around the scanned dim.
//   inner == 1: a block per row; the row is read in tiles of blockDim * kScanItems elements, each thread summing
//     kScanItems consecutive ones, a block scan (shared memory, Hillis-Steele) of the thread totals giving each
//     thread its offset, and the running total of earlier tiles carried forward;
//   inner > 1: a thread per (outer, inner) column walking the n elements in order (coalesced across threads).
// Precision: float32 and float64 accumulate in double, bfloat16 and float16 in float, as the CPU kernel; each
// prefix rounds once to x's dtype. Summation order differs from the CPU's only in how a tile's partial sums meet.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

template <typename T>
using ScanAcc = std::conditional_t<std::is_same_v<T, float> || std::is_same_v<T, double>, double, float>;

constexpr int kScanItems = 8;

template <typename T>
__global__ void ScanColumnsKernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner,
                                  bool reverse) {
    using A = ScanAcc<T>;
    GPU_KERNEL_LOOP(col, outer * inner) {
        const int64_t base = (col / inner) * n * inner + col % inner;
        A s = 0;
        for (int64_t j = 0; j < n; ++j) {
            const int64_t k = base + (reverse ? n - 1 - j : j) * inner;
            s += static_cast<A>(ToAcc(x[k]));
            y[k] = FromAcc<T>(static_cast<Acc<T>>(s));
        }
    }
}

// blockDim.x threads (a power of two, at most kThreads) scan one row each, grid-stride over rows.
template <typename T>
__global__ void ScanRowsKernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n, bool reverse) {
    using A = ScanAcc<T>;
    __shared__ A buf[kThreads];
    const int t = threadIdx.x;
    const int64_t tile = static_cast<int64_t>(blockDim.x) * kScanItems;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        A carry = 0;
        for (int64_t t0 = 0; t0 < n; t0 += tile) {
            A v[kScanItems];
            A total = 0;
#pragma unroll
            for (int k = 0; k < kScanItems; ++k) {
                const int64_t j = t0 + static_cast<int64_t>(t) * kScanItems + k;
                const A e = j < n ? static_cast<A>(ToAcc(xr[reverse ? n - 1 - j : j])) : A(0);
                total += e;
                v[k] = total;
            }
            buf[t] = total;
            __syncthreads();
            for (int o = 1; o < static_cast<int>(blockDim.x); o <<= 1) {
                const A add = t >= o ? buf[t - o] : A(0);
                __syncthreads();
                buf[t] += add;
                __syncthreads();
            }
            const A before = carry + buf[t] - total;  // the sum of everything ahead of this thread's elements
            const A tile_total = buf[blockDim.x - 1];
#pragma unroll
            for (int k = 0; k < kScanItems; ++k) {
                const int64_t j = t0 + static_cast<int64_t>(t) * kScanItems + k;
                if (j < n) yr[reverse ? n - 1 - j : j] = FromAcc<T>(static_cast<Acc<T>>(before + v[k]));
            }
            carry += tile_total;
            __syncthreads();  // buf is rewritten by the next tile
        }
    }
}

template <typename T>
void LaunchCumsum(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool reverse, NativeStream_t s,
                  const char* op) {
    if (outer * n * inner == 0) return;
    if (inner == 1) {
        int threads = 32;
        while (threads < kThreads && static_cast<int64_t>(threads) * kScanItems < n) threads *= 2;
        ScanRowsKernel<T><<<Blocks(outer, 1), threads, 0, s>>>(x, y, outer, n, reverse);
    } else {
        ScanColumnsKernel<T><<<Blocks(outer * inner), kThreads, 0, s>>>(x, y, outer, n, inner, reverse);
    }
    GPU_CHECK_LAUNCH(op);
}

}  // namespace infinitrain::gpu
