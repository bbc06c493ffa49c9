// Shape kernels: permute, slice / slice_backward, concat / stack / split and
// tril / triu.
//
// Every tensor is contiguous, so these are copies that move elements as raw
// bits (any dtype). permute walks the output in row-major order and reads the
// input through the permuted strides (the host drops size-1 dims and merges
// output dims that stay contiguous in the input, so [B, T, H, D] -> [B, H, T, D]
// reads rows of D, moved in units of up to 16 bytes). The others view a tensor
// as (outer, n, inner) around one dim: a slice, a concat input or a split
// output is the block [start : start + len * step : step] of the middle dim;
// with step 1 that is one contiguous run per outer index, copied as rows in
// units of up to 16 bytes. Indices are 32-bit whenever they fit.
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

// The output walked in row-major order over `nd` coalesced dims, reading the input through their strides. I is
// the index type: 32-bit indices when everything fits (integer division is several times cheaper), and U the
// unit moved, up to 16 bytes when the innermost dim stays contiguous.
template <typename I>
struct PermutePlan {
    int nd;
    I size[kMaxDims];
    I stride[kMaxDims];
};

// Each thread moves kPermuteUnroll units a tile (blockDim.x apart, so every load and store stays coalesced), its
// loads issued before its stores: with one unit per thread the copy was latency-bound (a [16, 1024, 12, 64]
// bfloat16 swap of dims 1 and 2 took 48 us on an H200, 26 us like this).
constexpr int kPermuteUnroll = 4;

template <typename U, typename I>
__global__ void PermuteKernel(PermutePlan<I> p, const U* __restrict__ x, U* __restrict__ y, I n) {
    const I tile = static_cast<I>(blockDim.x) * kPermuteUnroll;
    for (I base = static_cast<I>(blockIdx.x) * tile; base < n; base += static_cast<I>(gridDim.x) * tile) {
        U v[kPermuteUnroll];
#pragma unroll
        for (int k = 0; k < kPermuteUnroll; ++k) {
            I i = base + static_cast<I>(k * blockDim.x + threadIdx.x), off = 0;
            if (i >= n) break;
            for (int d = p.nd - 1; d >= 0; --d) {
                const I t = i / p.size[d];
                off += (i - t * p.size[d]) * p.stride[d];
                i = t;
            }
            v[k] = x[off];
        }
#pragma unroll
        for (int k = 0; k < kPermuteUnroll; ++k) {
            const I q = base + static_cast<I>(k * blockDim.x + threadIdx.x);
            if (q < n) y[q] = v[k];
        }
    }
}

// rows x row_units units U: dst[r * dst_stride + u] = src[r * src_stride + u] (slices, concat, split with step 1).
template <typename U, typename I>
__global__ void RowCopyKernel(const U* __restrict__ src, U* __restrict__ dst, I rows, I row_units, I src_stride,
                              I dst_stride) {
    const I total = rows * row_units;
    for (I q = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; q < total;
         q += static_cast<I>(gridDim.x) * blockDim.x) {
        const I r = q / row_units, u = q - r * row_units;
        dst[r * dst_stride + u] = src[r * src_stride + u];
    }
}

// part[o, j, i] <-> full[o, start + j * step, i] for o < outer, j < len, i < inner (in units of U); to_part
// picks the direction.
template <typename U>
__global__ void SliceCopyKernel(U* __restrict__ full, U* __restrict__ part, int64_t outer, int64_t n, int64_t len,
                                int64_t inner, int64_t start, int64_t step, bool to_part) {
    const int64_t per_outer = len * inner;
    GPU_KERNEL_LOOP(q, outer * per_outer) {
        const int64_t o = q / per_outer, rem = q - o * per_outer, j = rem / inner, i = rem - j * inner;
        const int64_t f = (o * n + start + j * step) * inner + i;
        if (to_part) {
            part[q] = full[f];
        } else {
            full[f] = part[q];
        }
    }
}

// tril (kLower) keeps x[..., i, j] with j <= i + k, triu keeps j >= i + k; the rest become zero bits.
template <typename U, bool kLower>
__global__ void TriKernel(const U* __restrict__ x, U* __restrict__ y, int64_t total, int64_t M, int64_t N, int64_t k) {
    GPU_KERNEL_LOOP(q, total) {
        const int64_t r = q / N, j = q - r * N, i = r % M;
        const bool keep = kLower ? j <= i + k : j >= i + k;
        y[q] = keep ? x[q] : U(0);
    }
}

}  // namespace infinitrain::gpu
