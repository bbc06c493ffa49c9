// Reductions: sum, mean, amax over a set of dims, argmax along one dim, and
// sum_squares over everything.
//
// Layout: as the CPU kernel, size-1 dims are dropped and neighbours of the
// same kind (reduced or kept) merged, leaving groups such as [K0, R0, K1, R1].
// Each reduced group is one pass over an (outer, R, inner) view, last reduced
// group first, into a float64 scratch that the next pass reads:
//   inner == 1: rows of R contiguous elements, a 32-lane group per row (R up to
//     4096) or blocks over fixed chunks of a long row;
//   inner > 1: a thread per output column, walking R with stride inner
//     (coalesced across threads), long R cut into fixed chunks.
// Chunk partials are combined in chunk order by a second kernel, and the chunk
// sizes depend only on the shape, so results are deterministic.
//
// Precision: sum, mean, amax and sum_squares accumulate in double (float32
// sums of many same-sign values would miss the float32 tolerance, which the
// op tests check) and round once to the output dtype. amax propagates NaN;
// argmax returns the first maximum, a NaN counting as the maximum (the first
// NaN wins), comparing in the compute type.
#pragma once

#include <cstdint>
#include <limits>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

enum class RedKind { kSum, kMax };

template <RedKind K>
struct RedOp {
    __device__ __forceinline__ double operator()(double a, double b) const {
        if (K == RedKind::kSum) return a + b;
        return NanMaxOp()(a, b);
    }
    static __device__ __forceinline__ double Identity() { return K == RedKind::kSum ? 0.0 : -INFINITY; }
};

__device__ __forceinline__ double LoadDouble(const double* p) { return *p; }
template <typename T>
__device__ __forceinline__ double LoadDouble(const T* p) {
    return static_cast<double>(ToAcc(*p));
}

// inner == 1, short rows: 32-lane group g of the block reduces row base + g. The loop runs the same number of
// times in every thread of a block, so groups of one hardware warp always shuffle together.
template <RedKind K, typename In>
__global__ void RowGroupReduceKernel(const In* __restrict__ x, double* __restrict__ out, int64_t rows, int64_t R) {
    const int lane = threadIdx.x % kGroup, group = threadIdx.x / kGroup, per_block = blockDim.x / kGroup;
    const RedOp<K> op;
    GPU_BLOCK_ROWS_LOOP(base, rows, per_block) {
        const int64_t row = base + group;
        double acc = RedOp<K>::Identity();
        if (row < rows) {
            const In* xr = x + row * R;
            for (int64_t j = lane; j < R; j += kGroup) acc = op(acc, LoadDouble(xr + j));
        }
        acc = GroupReduce(acc, op);
        if (row < rows && lane == 0) out[row] = acc;
    }
}

// inner == 1, long rows: block b reduces chunk p of row r (item = r * P + p) into partial[p * rows + r].
template <RedKind K, typename In>
__global__ void RowBlockReduceKernel(const In* __restrict__ x, double* __restrict__ partial, int64_t rows, int64_t R,
                                     int64_t P, int64_t chunk) {
    const RedOp<K> op;
    for (int64_t item = blockIdx.x; item < rows * P; item += gridDim.x) {
        const int64_t r = item / P, p = item % P;
        const int64_t j0 = p * chunk, j1 = min(R, j0 + chunk);
        const In* xr = x + r * R;
        double acc = RedOp<K>::Identity();
        for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) acc = op(acc, LoadDouble(xr + j));
        acc = BlockReduce(acc, op, RedOp<K>::Identity());
        if (threadIdx.x == 0) partial[p * rows + r] = acc;
    }
}

// inner > 1: thread t reduces chunk p of column (o, i) into partial[p * outer * inner + o * inner + i].
template <RedKind K, typename In>
__global__ void ColReduceKernel(const In* __restrict__ x, double* __restrict__ partial, int64_t outer, int64_t R,
                                int64_t inner, int64_t P, int64_t chunk) {
    const RedOp<K> op;
    const int64_t nout = outer * inner;
    GPU_KERNEL_LOOP(t, P * nout) {
        const int64_t p = t / nout, oi = t % nout, o = oi / inner, i = oi % inner;
        const int64_t r0 = p * chunk, r1 = min(R, r0 + chunk);
        const In* xc = x + o * R * inner + i;
        double acc = RedOp<K>::Identity();
        // Unrolled so that several loads are in flight (the adds stay in row order).
#pragma unroll 8
        for (int64_t r = r0; r < r1; ++r) acc = op(acc, LoadDouble(xc + r * inner));
        partial[t] = acc;
    }
}

// out[i] = partial[0][i] op partial[1][i] op ... in chunk order.
template <RedKind K>
__global__ void CombineKernel(const double* __restrict__ partial, double* __restrict__ out, int64_t nout, int64_t P) {
    const RedOp<K> op;
    GPU_KERNEL_LOOP(i, nout) {
        double acc = partial[i];
        for (int64_t p = 1; p < P; ++p) acc = op(acc, partial[p * nout + i]);
        out[i] = acc;
    }
}

// y[i] = v[i] * scale rounded to T (through its compute type, as the CPU stores).
template <typename T>
__global__ void FinalizeKernel(const double* __restrict__ v, T* __restrict__ y, int64_t n, double scale, bool mean) {
    GPU_KERNEL_LOOP(i, n) { y[i] = FromAcc<T>(static_cast<Acc<T>>(mean ? v[i] * scale : v[i])); }
}

// ---- argmax -------------------------------------------------------------------------

// Whether (va, ia) beats (vb, ib): NaN beats numbers, larger beats smaller, and ties go to the lower index.
template <typename V>
__device__ __forceinline__ bool ArgBetter(V va, int64_t ia, V vb, int64_t ib) {
    const bool na = isnan(va), nb = isnan(vb);
    if (na || nb) return na && (!nb || ia < ib);
    if (va != vb) return va > vb;
    return ia < ib;
}

template <typename V>
__device__ __forceinline__ void ArgReduceGroup(V& v, int64_t& idx) {
#pragma unroll
    for (int o = kGroup / 2; o > 0; o >>= 1) {
        const V ov = __shfl_xor_sync(kFullLaneMask, v, o, kGroup);
        const int64_t oi = __shfl_xor_sync(kFullLaneMask, idx, o, kGroup);
        if (ArgBetter(ov, oi, v, idx)) {
            v = ov;
            idx = oi;
        }
    }
}

// inner == 1: rows of R; each 32-lane group (kBlockPerRow false) or block (true) handles one row.
template <typename T, bool kBlockPerRow>
__global__ void ArgmaxRowKernel(const T* __restrict__ x, int64_t* __restrict__ out, int64_t rows, int64_t R) {
    using V = Acc<T>;
    __shared__ V sv[32];
    __shared__ int64_t si[32];
    const int lane = threadIdx.x % kGroup, group = threadIdx.x / kGroup, groups = blockDim.x / kGroup;
    const int per_block = kBlockPerRow ? 1 : groups;
    const int width = kBlockPerRow ? blockDim.x : kGroup;
    const int pos = kBlockPerRow ? threadIdx.x : lane;
    GPU_BLOCK_ROWS_LOOP(base, rows, per_block) {
        const int64_t row = base + (kBlockPerRow ? 0 : group);
        V best = -INFINITY;
        int64_t bi = std::numeric_limits<int64_t>::max();
        if (row < rows) {
            const T* xr = x + row * R;
            for (int64_t j = pos; j < R; j += width) {
                const V v = ToAcc(xr[j]);
                if (ArgBetter(v, j, best, bi)) {
                    best = v;
                    bi = j;
                }
            }
        }
        ArgReduceGroup(best, bi);
        if (kBlockPerRow) {
            __syncthreads();  // the previous row's readers are done with sv/si
            if (lane == 0) {
                sv[group] = best;
                si[group] = bi;
            }
            __syncthreads();
            if (group == 0) {
                best = lane < groups ? sv[lane] : V(-INFINITY);
                bi = lane < groups ? si[lane] : std::numeric_limits<int64_t>::max();
                ArgReduceGroup(best, bi);
            }
            if (threadIdx.x == 0) out[row] = bi;
        } else if (row < rows && lane == 0) {
            out[row] = bi;
        }
    }
}

// inner > 1: a thread per column (o, i), the CPU's loop.
template <typename T>
__global__ void ArgmaxColKernel(const T* __restrict__ x, int64_t* __restrict__ out, int64_t outer, int64_t R,
                                int64_t inner) {
    using V = Acc<T>;
    GPU_KERNEL_LOOP(t, outer * inner) {
        const int64_t o = t / inner, i = t % inner;
        const T* xc = x + o * R * inner + i;
        V best = ToAcc(xc[0]);
        int64_t bi = 0;
        for (int64_t r = 1; r < R; ++r) {
            const V v = ToAcc(xc[r * inner]);
            if (!isnan(best) && (v > best || isnan(v))) {
                best = v;
                bi = r;
            }
        }
        out[t] = bi;
    }
}

// ---- sum_squares ------------------------------------------------------------------------

template <typename T>
__global__ void SumSquaresPartialKernel(const T* __restrict__ x, int64_t n, double* __restrict__ partial) {
    double acc = 0.0;
    GPU_KERNEL_LOOP(i, n) {
        const double v = LoadDouble(x + i);
        acc += v * v;
    }
    acc = BlockReduce(acc, SumOp(), 0.0);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block: the sum of `count` partials, stored as S (float or double).
template <typename S>
__global__ void SumPartialsKernel(const double* __restrict__ partial, int64_t count, S* __restrict__ out) {
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = BlockReduce(acc, SumOp(), 0.0);
    if (threadIdx.x == 0) *out = static_cast<S>(acc);
}

// The sum of `count` partials into the 0-d y (float32 or float64), by one block in a fixed order.
inline void LaunchSumPartials(NativeStream_t s, const double* partial, int64_t count, const Tensor& y) {
    if (y.dtype() == DataType::kFloat64) {
        SumPartialsKernel<double><<<1, 1024, 0, s>>>(partial, count, y.data<double>());
    } else {
        SumPartialsKernel<float><<<1, 1024, 0, s>>>(partial, count, y.data<float>());
    }
}

}  // namespace infinitrain::gpu
