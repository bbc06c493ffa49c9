// Attention kernels.
//   rope(x [B, T, H, D], cos, sin [T, D/2], inverse): rotates each pair (x[..., 2i], x[..., 2i+1]) of position t
//     by angle[t, i]: out0 = x0 cos - x1 sin, out1 = x0 sin + x1 cos (sin negated when inverse); a thread per pair,
//     products in double (exact for float32 inputs), one rounding per output, as on the CPU.
//   sdpa(q [B, Hq, T, D], k, v [B, Hkv, S, D], causal, scale) -> out [B, Hq, T, D], lse [B, Hq, T]:
//     query heads h of kv head h / g (g = Hq / Hkv) are contiguous, so per (b, kv head) the g * T query rows form
//     one [g*T, D] matrix and every product is one strided-batched GEMM over B * Hkv batches:
//       scores [g*T, S] = scale * Q K^T;  row softmax (causal: key s > query t masked) writes P in place and
//       lse = max + log(sum);  out = P V.
//     Causal attention runs in blocks of kSdpaQueryBlock queries (one GEMM per query head of a kv head): block j
//     takes only its first (j + 1) * tb keys, which skips the masked upper triangle (3/8 of the products and
//     of the score memory at T = 1024) and bounds the scratch to one block.
//   sdpa_backward(dO, q, k, v, out, lse) -> dq, dk, dv: per block, recomputes the scores and dP = dO V^T, then in
//     one pass P = exp(scores - lse) (masked entries 0) and dS = P * (dP - rowsum(dO * out)); dV += P^T dO,
//     dQ = scale * dS K, dK += scale * dS^T Q (the [S, g*T] @ [g*T, D] products sum over the query heads of a kv
//     head by construction; the blocks run last first, so the first product into dK, dV covers all S keys).
//   sdpa_bthd(q [B, T, Hq, D], ...) runs sdpa between permute copies.
//   This is the GEMM path: scratch is O(B * Hq * min(T, kSdpaQueryBlock) * S) (a score block forward, two
//   backward, plus 16-bit copies of P and dS); flash_attention.cuh runs without it where it applies.
// Precision: softmax in float32 (float64 for float64 inputs). float32/float64 GEMMs in their own type; bfloat16/
// float16 GEMMs take their 16-bit operands as they are (tensor cores, float32 accumulation) with P and dS rounded
// to the 16-bit type before their products, as cuDNN and the flash kernels do; lse is float32 (float64).
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

// Queries per block of the causal GEMM path (INFINITRAIN_GPU_SDPA_BLOCK overrides it, to measure others).
constexpr int64_t kSdpaQueryBlock = 256;

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

// The query rows of one score block [B * Hkv, g, tb, S]: row r is query t0 + r % tb of query head q = r / tb
// (the index into [B, Hq]), its row of q, out and lse [B * Hq, T] is q * T + t0 + r % tb. The causal GEMM path
// runs a block of tb queries at a time against their first t0 + tb keys; without blocks tb = T and t0 = 0.
struct QueryRows {
    int64_t tb, t0, T;
    __device__ int64_t Query(int64_t r) const { return t0 + r % tb; }
    __device__ int64_t Row(int64_t r) const { return (r / tb) * T + Query(r); }
};

// Rows of a score block [rows, S]. Each 32-lane group (kBlock false) or block (true) turns one row into
// probabilities (keys after the query masked to 0 when causal), written to probs (the scores themselves, or a
// 16-bit copy), and writes its lse.
template <bool kBlock, typename C, typename O>
__global__ void SdpaSoftmaxKernel(C* scores, O* probs, C* __restrict__ lse, int64_t rows, int64_t S, QueryRows qr,
                                  bool causal) {
    const int per_block = kBlock ? 1 : blockDim.x / kGroup;
    const int64_t sub = kBlock ? 0 : threadIdx.x / kGroup;
    const int pos = kBlock ? threadIdx.x : threadIdx.x % kGroup, width = kBlock ? blockDim.x : kGroup;
    GPU_BLOCK_ROWS_LOOP(base, rows, per_block) {
        const int64_t r = base + sub;
        const bool valid = r < rows;
        C* row = scores + (valid ? r : 0) * S;
        const int64_t n = !valid ? 0 : (causal ? qr.Query(r) + 1 : S);
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
            if (pos == 0) lse[qr.Row(r)] = mx + Log(sum);  // S == 0: -inf
        }
    }
}

// Backward of a score block: P = exp(scores - lse) (masked keys 0) into p (the scores themselves, or a 16-bit
// copy) and dS = P * (dP - D_r), D_r = sum_e dO[r, e] * out[r, e] (in double, rounded to C), into ds (dP itself,
// or a 16-bit copy); a 32-lane group (kBlock false) or a block (true) per row, as the softmax. Each element is read
// before the same thread writes it, so p and ds may alias scores and dP.
template <bool kBlock, typename T, typename C, typename O>
__global__ void SdpaProbsDsKernel(const C* scores, const C* dP, O* p, O* ds, const C* __restrict__ lse,
                                  const T* __restrict__ dO, const T* __restrict__ out, int64_t rows, int64_t S,
                                  int64_t D, QueryRows qr, bool causal) {
    const int per_block = kBlock ? 1 : blockDim.x / kGroup;
    const int64_t sub = kBlock ? 0 : threadIdx.x / kGroup;
    const int pos = kBlock ? threadIdx.x : threadIdx.x % kGroup, width = kBlock ? blockDim.x : kGroup;
    GPU_BLOCK_ROWS_LOOP(base, rows, per_block) {
        const int64_t r = base + sub;
        const bool valid = r < rows;
        const int64_t row = valid ? qr.Row(r) : 0, n = !valid ? 0 : (causal ? qr.Query(r) + 1 : S);
        double di = 0;
        for (int64_t e = pos; valid && e < D; e += width) {
            di += static_cast<double>(ToAcc(dO[row * D + e])) * static_cast<double>(ToAcc(out[row * D + e]));
        }
        const C dc = static_cast<C>(kBlock ? BlockReduce(di, SumOp(), 0.0) : GroupReduce(di, SumOp()));
        if (!valid) continue;
        const C l = lse[row];
        for (int64_t s = pos; s < S; s += width) {
            const int64_t i = r * S + s;
            const C pv = s < n ? Exp(scores[i] - l) : C(0);
            const C dv = pv * (dP[i] - dc);
            p[i] = FromAcc<O>(pv);
            ds[i] = FromAcc<O>(dv);
        }
    }
}

}  // namespace infinitrain::gpu
