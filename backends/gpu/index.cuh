// Indexing kernels: embedding / embedding_backward and gather / scatter_add.
//
// Layout: embedding reads weight [V, C] rows by int64 index [N] into [N, C];
// its backward sums grad rows [N, C] into dweight [V, C]. gather / scatter_add
// view x as (outer, n, inner) and index / src as (outer, m, inner) around dim.
//
// embedding_backward is deterministic and needs no atomics: the keys
// index * N + position are sorted (a bitonic sort, shared-memory tiles of
// 2048 keys plus global merge steps), so each weight row's positions become
// one ascending run; one block per run sums its grad rows in position order,
// in double, and rounds once (the CPU's order and rounding). Rows no index
// names are zero. scatter_add accumulates in a float64 copy of x with atomic
// adds (repeated indices collide safely; the order of the adds, and so the
// last bits of a double sum before the final rounding, may vary).
//
// Bad indices (outside [0, limit)) are recorded in the device-error record
// (device_error.h) and skipped: no out-of-bounds access, and the affected
// outputs are NaN (embedding, gather) or miss that contribution.
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"
#include "backends/gpu/device_error.h"

namespace infinitrain::gpu {

// out[r, :] = weight[index[r], :], rows moved as `units` raw units of U each; a bad index gives a NaN row
// (all-ones bytes are NaN in every float dtype).
template <typename U>
__global__ void EmbeddingKernel(const U* __restrict__ w, const int64_t* __restrict__ index, U* __restrict__ out,
                                int64_t rows, int64_t units, int64_t V, DeviceErrorRecord* err) {
    GPU_KERNEL_LOOP(i, rows * units) {
        const int64_t r = i / units, j = i - r * units;
        const int64_t v = index[r];
        if (v < 0 || v >= V) {
            if (j == 0) RecordIndexError(err, IndexErrorKind::kEmbedding, v, r, V, 0);
            U ones;
            memset(&ones, 0xff, sizeof(U));
            out[i] = ones;
        } else {
            out[i] = w[v * units + j];
        }
    }
}

// Records the first index outside [0, limit).
static __global__ void CheckIndicesKernel(const int64_t* __restrict__ index, int64_t n, int64_t limit,
                                          IndexErrorKind kind, int64_t extra, DeviceErrorRecord* err) {
    GPU_KERNEL_LOOP(i, n) {
        const int64_t v = index[i];
        if (v < 0 || v >= limit) RecordIndexError(err, kind, v, i, limit, extra);
    }
}

// keys[p] = index[p] * N + p for p < N (bad indices get the maximum key and are recorded), all-ones padding after.
static __global__ void EmbeddingKeysKernel(const int64_t* __restrict__ index, uint64_t* __restrict__ keys, int64_t N,
                                           int64_t padded, int64_t V, DeviceErrorRecord* err) {
    GPU_KERNEL_LOOP(p, padded) {
        uint64_t key = ~uint64_t{0};
        if (p < N) {
            const int64_t v = index[p];
            if (v < 0 || v >= V) {
                RecordIndexError(err, IndexErrorKind::kEmbeddingBackward, v, p, V, 0);
            } else {
                key = static_cast<uint64_t>(v) * static_cast<uint64_t>(N) + static_cast<uint64_t>(p);
            }
        }
        keys[p] = key;
    }
}

constexpr int kSortTile = 2048;  // keys per shared-memory tile (two per thread of a 1024-thread block)

// Compare-exchange of keys[i] and keys[i ^ j] for the bitonic stage of block size k: ascending where bit k of i is 0.
__device__ __forceinline__ void BitonicStep(uint64_t* keys, int64_t i, int64_t j, int64_t k) {
    const int64_t l = i ^ j;
    if (l > i) {
        const uint64_t a = keys[i], b = keys[l];
        const bool ascending = (i & k) == 0;
        if ((a > b) == ascending) {
            keys[i] = b;
            keys[l] = a;
        }
    }
}

// Every step with j < kSortTile of stages k_first..k_last (powers of two) within one tile, in shared memory.
// k_first == 2 sorts each tile from scratch; k_first == k_last == k finishes stage k after the global steps.
static __global__ void BitonicTileKernel(uint64_t* __restrict__ keys, int64_t k_first, int64_t k_last) {
    __shared__ uint64_t tile[kSortTile];
    const int64_t base = static_cast<int64_t>(blockIdx.x) * kSortTile;
    for (int t = threadIdx.x; t < kSortTile; t += blockDim.x) tile[t] = keys[base + t];
    __syncthreads();
    for (int64_t k = k_first; k <= k_last; k *= 2) {
        for (int64_t j = std::min<int64_t>(k / 2, kSortTile / 2); j > 0; j /= 2) {
            for (int t = threadIdx.x; t < kSortTile; t += blockDim.x) {
                const int l = t ^ static_cast<int>(j);
                if (l > t) {
                    const uint64_t a = tile[t], b = tile[l];
                    const bool ascending = ((base + t) & k) == 0;
                    if ((a > b) == ascending) {
                        tile[t] = b;
                        tile[l] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int t = threadIdx.x; t < kSortTile; t += blockDim.x) keys[base + t] = tile[t];
}

// One global step (j >= kSortTile) of stage k.
static __global__ void BitonicGlobalKernel(uint64_t* __restrict__ keys, int64_t n, int64_t j, int64_t k) {
    GPU_KERNEL_LOOP(i, n) { BitonicStep(keys, i, j, k); }
}

// Block b takes sorted positions p = b, b + grid, ...: when p starts a run of one weight row, the block sums the
// run's grad rows (position order, double) into that row of dweight.
template <typename T>
__global__ void EmbeddingRunsKernel(const uint64_t* __restrict__ keys, const T* __restrict__ grad, T* __restrict__ dw,
                                    int64_t N, int64_t C) {
    const uint64_t n = static_cast<uint64_t>(N);
    for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
        const uint64_t key = keys[p];
        if (key == ~uint64_t{0}) continue;  // bad indices sort last
        const uint64_t row = key / n;
        if (p > 0 && keys[p - 1] / n == row) continue;  // not the start of the run
        int64_t end = p + 1;
        while (end < N && keys[end] != ~uint64_t{0} && keys[end] / n == row) ++end;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            double acc = 0.0;
            for (int64_t q = p; q < end; ++q) {
                const int64_t pos = static_cast<int64_t>(keys[q] % n);
                acc += static_cast<double>(ToAcc(grad[pos * C + c]));
            }
            dw[static_cast<int64_t>(row) * C + c] = FromAcc<T>(static_cast<Acc<T>>(acc));
        }
    }
}

// out[o, j, i] = x[o, index[o, j, i], i].
template <typename T>
__global__ void GatherKernel(const T* __restrict__ x, const int64_t* __restrict__ index, T* __restrict__ out,
                             int64_t total, int64_t n, int64_t m, int64_t inner, int64_t dim, DeviceErrorRecord* err) {
    GPU_KERNEL_LOOP(q, total) {
        const int64_t o = q / (m * inner), i = q % inner;
        const int64_t v = index[q];
        if (v < 0 || v >= n) {
            RecordIndexError(err, IndexErrorKind::kGather, v, q, n, dim);
            out[q] = FromAcc<T>(static_cast<Acc<T>>(NAN));
        } else {
            out[q] = x[(o * n + v) * inner + i];
        }
    }
}

template <typename T>
__global__ void ToDoubleKernel(const T* __restrict__ x, double* __restrict__ y, int64_t n) {
    GPU_KERNEL_LOOP(i, n) { y[i] = static_cast<double>(ToAcc(x[i])); }
}

// buf[o, index[o, j, i], i] += src[o, j, i].
template <typename T>
__global__ void ScatterAddKernel(double* __restrict__ buf, const int64_t* __restrict__ index, const T* __restrict__ src,
                                 int64_t total, int64_t n, int64_t m, int64_t inner, int64_t dim,
                                 DeviceErrorRecord* err) {
    GPU_KERNEL_LOOP(q, total) {
        const int64_t o = q / (m * inner), i = q % inner;
        const int64_t v = index[q];
        if (v < 0 || v >= n) {
            RecordIndexError(err, IndexErrorKind::kScatterAdd, v, q, n, dim);
        } else {
            atomicAdd(buf + (o * n + v) * inner + i, static_cast<double>(ToAcc(src[q])));
        }
    }
}

template <typename T>
__global__ void FromDoubleKernel(const double* __restrict__ x, T* __restrict__ y, int64_t n) {
    GPU_KERNEL_LOOP(i, n) { y[i] = FromAcc<T>(static_cast<Acc<T>>(x[i])); }
}

}  // namespace infinitrain::gpu
