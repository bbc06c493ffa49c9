// Shape kernels: permute, slice / slice_backward, concat / stack / split and
// tril / triu.
//
// Every tensor is contiguous, so these are copies that move elements as raw
// bits (any dtype). permute walks the output in row-major order and reads the
// input through the permuted strides (the host drops size-1 dims and merges
// output dims that stay contiguous in the input, so [B, T, H, D] -> [B, H, T, D]
// reads rows of D). The others view a tensor as (outer, n, inner) around one
// dim: a slice, a concat input or a split output is the block
// [start : start + len * step : step] of the middle dim, copied in units of up
// to 16 bytes when the inner block and both pointers allow.
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

template <typename U>
__global__ void PermuteKernel(Broadcast<1> b, const U* __restrict__ x, U* __restrict__ y, int64_t n) {
    GPU_KERNEL_LOOP(q, n) {
        int64_t off[1];
        BroadcastOffsets(b, q, off);
        y[q] = x[off[0]];
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
