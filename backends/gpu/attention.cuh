// Attention kernels.
//   rope(x [B, T, H, D], cos, sin [T, D/2], inverse): rotates each pair (x[..., 2i], x[..., 2i+1]) of position t
//     by angle[t, i]: out0 = x0 cos - x1 sin, out1 = x0 sin + x1 cos (sin negated when inverse); a thread per pair,
//     products in double (exact for float32 inputs), one rounding per output, as on the CPU.
//   sdpa(q [B, Hq, T, D], k, v [B, Hkv, S, D], causal, scale) -> out [B, Hq, T, D], lse [B, Hq, T]:
//     query heads h of kv head h / g (g = Hq / Hkv) are contiguous, so per (b, kv head) the g * T query rows form
//     one [g*T, D] matrix and every product is one strided-batched GEMM over B * Hkv batches:
//       scores [g*T, S] = scale * Q K^T;  row softmax (causal: key s > query t masked) writes P in place and
//       lse = max + log(sum);  out = P V.
//   sdpa_backward(dO, q, k, v, out, lse) -> dq, dk, dv: recomputes P = exp(scores - lse) (masked entries 0), then
//       dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dO * out));  dQ = scale * dS K;  dK = scale * dS^T Q,
//     where the [S, g*T] @ [g*T, D] products sum over the g query heads of a kv head by construction.
//   sdpa_bthd(q [B, T, Hq, D], ...) runs sdpa between permute copies.
//   This is the GEMM path: scratch is O(B * Hq * T * S) (one score matrix forward, two backward, plus 16-bit
//   copies of P); flash_attention.cuh runs without it where it applies.
// Precision: softmax in float32 (float64 for float64 inputs). float32/float64 GEMMs in their own type; bfloat16/
// float16 GEMMs take their 16-bit operands as they are (tensor cores, float32 accumulation) with P and dS rounded
// to the 16-bit type before their products, as cuDNN and the flash kernels do; lse is float32 (float64).
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

template <typename T>
__global__ void RopeKernel(const T* __restrict__ x, const Acc<T>* __restrict__ cos_t, const Acc<T>* __restrict__ sin_t,
                           T* __restrict__ y, int64_t pairs, int64_t T_len, int64_t H, int64_t half, double sign) {
    GPU_KERNEL_LOOP(q, pairs) {
        const int64_t i = q % half, row = q / half, t = (row / H) % T_len;
        const double c = cos_t[t * half + i], s = sign * static_cast<double>(sin_t[t * half + i]);
        const double x0 = ToAcc(x[2 * q]), x1 = ToAcc(x[2 * q + 1]);
        y[2 * q] = FromAcc<T>(static_cast<Acc<T>>(x0 * c - x1 * s));
        y[2 * q + 1] = FromAcc<T>(static_cast<Acc<T>>(x0 * s + x1 * c));
    }
}

// Rows of the score matrix [rows, S]; row r is query t = r % T. Each 32-lane group (kBlock false) or block (true)
// turns one row into probabilities (masked keys 0), written to probs (the scores themselves, or a 16-bit copy), and
// writes its lse.
template <bool kBlock, typename C, typename O>
__global__ void SdpaSoftmaxKernel(C* scores, O* probs, C* __restrict__ lse, int64_t rows, int64_t T_len, int64_t S,
                                  bool causal) {
    const int per_block = kBlock ? 1 : blockDim.x / kGroup;
    const int64_t sub = kBlock ? 0 : threadIdx.x / kGroup;
    const int pos = kBlock ? threadIdx.x : threadIdx.x % kGroup, width = kBlock ? blockDim.x : kGroup;
    GPU_BLOCK_ROWS_LOOP(base, rows, per_block) {
        const int64_t r = base + sub;
        const bool valid = r < rows;
        C* row = scores + (valid ? r : 0) * S;
        const int64_t n = !valid ? 0 : (causal ? r % T_len + 1 : S);  // causal implies T == S
        C mx = -INFINITY;
        for (int64_t s = pos; s < n; s += width) mx = Fmax(mx, row[s]);
        mx = kBlock ? BlockReduce(mx, FmaxOp(), C(-INFINITY)) : GroupReduce(mx, FmaxOp());
        C sum = 0;
        for (int64_t s = pos; s < n; s += width) sum += Exp(row[s] - mx);
        sum = kBlock ? BlockReduce(sum, SumOp(), C(0)) : GroupReduce(sum, SumOp());
        const C inv = C(1) / sum;
        if (valid) {
            O* out = probs + r * S;
            for (int64_t s = pos; s < S; s += width) out[s] = FromAcc<O>(s < n ? Exp(row[s] - mx) * inv : C(0));
            if (pos == 0) lse[r] = mx + Log(sum);  // S == 0: -inf
        }
    }
}

// P = exp(scores - lse) in place, masked keys 0; also rounded into p16 when it is not null.
template <typename C, typename O>
__global__ void SdpaProbsKernel(C* __restrict__ scores, O* __restrict__ p16, const C* __restrict__ lse, int64_t rows,
                                int64_t T_len, int64_t S, bool causal) {
    GPU_KERNEL_LOOP(i, rows * S) {
        const int64_t r = i / S, s = i - r * S;
        const C p = (causal && s > r % T_len) ? C(0) : Exp(scores[i] - lse[r]);
        scores[i] = p;
        if (p16) p16[i] = FromAcc<O>(p);
    }
}

// dS[r, s] = P[r, s] * (dP[r, s] - D_r), D_r = sum_e dO[r, e] * out[r, e] (in double, rounded to C), into ds (dP
// itself, or a 16-bit copy); one block per row.
template <typename T, typename C, typename O>
__global__ void SdpaDsKernel(const C* __restrict__ P, const C* dP, O* ds, const T* __restrict__ dO,
                             const T* __restrict__ out, int64_t rows, int64_t S, int64_t D) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        double di = 0;
        for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
            di += static_cast<double>(ToAcc(dO[r * D + e])) * static_cast<double>(ToAcc(out[r * D + e]));
        }
        const C dc = static_cast<C>(BlockReduce(di, SumOp(), 0.0));
        for (int64_t s = threadIdx.x; s < S; s += blockDim.x) {
            ds[r * S + s] = FromAcc<O>(P[r * S + s] * (dP[r * S + s] - dc));
        }
    }
}

}  // namespace infinitrain::gpu
