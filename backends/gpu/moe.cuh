// Mixture-of-experts routing: top-k gating and dropless dispatch / combine (the CPU kernels in
// infinitrain/kernels/cpu/moe.cc give the semantics).
//   moe_topk(logits [N, E]; k, normalize) -> weights [N, k], experts [N, k] int64: a 32-lane group per row makes k
//     selection passes over E; in each pass every lane scans its experts (e = lane, lane + 32, ...) not yet taken
//     (a byte per expert in shared memory, or in a [N, E] scratch when E > kMoeSharedExperts) for the first untaken one
//     and the first maximum among the non-NaN untaken ones, and the group combines them: the pick is the first untaken
//     expert when its logit is NaN, else the first maximum, exactly the CPU's sequential scan (ties to the lower
//     expert, -0 == +0). Weights: exp(x - m) / denom with m = the first pick's logit (normalize=1, denom over the k
//     picks) or fmax of the row (normalize=0, denom over all E).
//   moe_topk_backward(logits, experts, grad; normalize) -> dlogits [N, E]: a 32-lane group per row; the softmax
//     statistics are group sums, then each lane builds dl for its experts, adding the contributions of the choices
//     j naming that expert in order j = 0, 1, ... as the CPU does (repeated experts accumulate).
//   moe_permute(x [N, C], experts [N, k]; E) -> out [N*k, C], source [N*k], counts [E]: a deterministic stable
//     counting sort of the S = N*k slots in chunks of kMoeChunk slots: (1) a block per chunk loads the chunk's expert
//     ids into shared memory and a thread per expert counts its slots -> per-chunk counts laid out expert-major
//     [E, chunks]; (2) one block scans them exclusively (offset of expert e in chunk c = rows of experts < e plus
//     rows of e in chunks < c) and writes counts; (3) a block per chunk again, a thread per expert walking the
//     chunk in slot order, writes source; (4) a grid-stride copy out[r, c] = x[source[r] / k, c].
//   moe_unpermute(y [S, C], source [S], weights [N, k]) -> out [N, C]: one kernel scatters pos = the inverse of
//     source (a uint32 mark per slot, atomicCAS, finds repeats), then out[n, c] = sum_j w[n, j] * y[pos[n*k+j], c]
//     in j order, a thread per output element.
//   moe_unpermute_backward(grad, y, source, weights) -> dy [S, C], dweights [N, k]: pos as above; dy[r, c] =
//     w[s] * grad[s / k, c] for s = source[r], a thread per element; dweights[s] = grad[s / k] . y[pos[s]], a
//     32-lane group per slot.
// Precision: as the CPU, every sum, exp and product is in double (explicitly rounded adds and multiplies, no FMA
// contraction) and each result is converted to the stat type (float32, float64 for float64 inputs) and then, for
// tensors of the input dtype, to bfloat16/float16 -- exactly the CPU's static_cast<Acc<T>> then Store. Sums over the
// row (the softmax denominators and the dot products of topk_backward and unpermute_backward) are taken in lane
// order, not sequentially, so float64 results can differ from the CPU's in the last bits; the combine sums over
// j and the copies are exact.
// Bad input: an expert outside [0, E) (topk_backward, permute) or a source that is not a permutation of [0, S)
// (unpermute, unpermute_backward) is recorded in the device-error record (the runtime raises the CPU's message at
// the next synchronisation) and never read through: topk_backward gives a NaN row, permute leaves the slot out
// (source -1 and a NaN row at the end of out), unpermute gives NaN where a slot has no row.
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"
#include "backends/gpu/device_error.h"

namespace infinitrain::gpu {

constexpr int kMoeChunk = 1024;              // slots per block in moe_permute's counting sort
constexpr int64_t kMoeSharedExperts = 4096;  // moe_topk keeps its taken flags in shared memory up to this E

__device__ __forceinline__ double AddRn(double a, double b) { return __dadd_rn(a, b); }

template <typename T>
__device__ __forceinline__ double LoadD(const T* p) {
    return static_cast<double>(ToAcc(*p));
}

// A double result stored as the CPU does: to the stat type first, then rounded to T.
template <typename T>
__device__ __forceinline__ T StoreD(double v) {
    return FromAcc<T>(static_cast<Acc<T>>(v));
}

// ---- moe_topk ------------------------------------------------------------------------

// A candidate (value, index) of a selection pass; index E means none.
__device__ __forceinline__ void CombineBest(double& bv, int64_t& bi, double ov, int64_t oi, int64_t E) {
    if (oi != E && (bi == E || ov > bv || (ov == bv && oi < bi))) {
        bv = ov;
        bi = oi;
    }
}

// A 32-lane group per row (grid-stride over rows in block-uniform steps). The taken flags live in dynamic shared
// memory (E bytes per group) when taken is null, else in taken [N, E] (large E).
template <typename T>
__global__ void MoeTopkKernel(const T* __restrict__ logits, Acc<T>* __restrict__ weights, int64_t* __restrict__ experts,
                              uint8_t* __restrict__ taken, int64_t N, int64_t E, int64_t k, bool normalize) {
    using S = Acc<T>;
    extern __shared__ uint8_t moe_taken[];  // E bytes per group when taken is null
    const int lane = threadIdx.x % kGroup;
    const int64_t per_block = blockDim.x / kGroup;
    GPU_BLOCK_ROWS_LOOP(base, N, per_block) {
        const int64_t row = base + threadIdx.x / kGroup;
        const bool live = row < N;
        const int64_t r = live ? row : 0;
        const int64_t len = live ? E : 0;  // a group past the end still joins its warp's shuffles
        const T* x = logits + r * E;
        uint8_t* tk = taken ? taken + r * E : moe_taken + (threadIdx.x / kGroup) * E;
        for (int64_t i = lane; i < len; i += kGroup) tk[i] = 0;  // each lane only reads and writes its own experts
        int64_t* chosen = experts + r * k;
        double first_value = 0;
        for (int64_t j = 0; j < k; ++j) {
            int64_t f = E, bi = E;
            double bv = 0;
            for (int64_t i = lane; i < len; i += kGroup) {
                if (tk[i]) continue;
                if (f == E) f = i;
                const double v = LoadD(x + i);
                if (!isnan(v) && (bi == E || v > bv)) {
                    bi = i;
                    bv = v;
                }
            }
#pragma unroll
            for (int o = kGroup / 2; o > 0; o >>= 1) {
                const long long of = __shfl_xor_sync(kFullLaneMask, static_cast<long long>(f), o, kGroup);
                const long long oi = __shfl_xor_sync(kFullLaneMask, static_cast<long long>(bi), o, kGroup);
                const double ov = __shfl_xor_sync(kFullLaneMask, bv, o, kGroup);
                f = f < of ? f : of;
                CombineBest(bv, bi, ov, oi, E);
            }
            if (!live) continue;
            // j < k <= E: some expert is untaken, so f < E; f's logit is not NaN means bi < E.
            const double fv = LoadD(x + f);
            const int64_t pick = isnan(fv) ? f : bi;
            if (pick % kGroup == lane) tk[pick] = 1;   // the lane that scans it
            if (j % kGroup == lane) chosen[j] = pick;  // the lane that weighs it
            if (j == 0) first_value = isnan(fv) ? fv : bv;
        }
        double m = first_value, denom = 0;
        if (normalize) {
            for (int64_t j = lane; j < (live ? k : 0); j += kGroup) {
                denom = AddRn(denom, exp(LoadD(x + chosen[j]) - m));
            }
        } else {
            for (int64_t i = lane; i < len; i += kGroup) m = fmax(m, LoadD(x + i));
            m = GroupReduce(m, FmaxOp());
            for (int64_t i = lane; i < len; i += kGroup) denom = AddRn(denom, exp(LoadD(x + i) - m));
        }
        denom = GroupReduce(denom, SumOp());
        for (int64_t j = lane; j < (live ? k : 0); j += kGroup) {
            weights[r * k + j] = static_cast<S>(exp(LoadD(x + chosen[j]) - m) / denom);
        }
    }
}

// ---- moe_topk_backward -------------------------------------------------------------------

// A 32-lane group per row. grad [N, k] of the stat type; dlogits [N, E].
template <typename T>
__global__ void MoeTopkBackwardKernel(const T* __restrict__ logits, const int64_t* __restrict__ experts,
                                      const Acc<T>* __restrict__ grad, T* __restrict__ dlogits, int64_t N, int64_t E,
                                      int64_t k, bool normalize, DeviceErrorRecord* err) {
    const int lane = threadIdx.x % kGroup;
    const int64_t per_block = blockDim.x / kGroup;
    GPU_BLOCK_ROWS_LOOP(base, N, per_block) {
        const int64_t row = base + threadIdx.x / kGroup;
        const bool live = row < N;
        const int64_t r = live ? row : 0;
        const T* x = logits + r * E;
        const int64_t* chosen = experts + r * k;
        const Acc<T>* g = grad + r * k;
        int bad = 0;
        for (int64_t j = lane; j < (live ? k : 0); j += kGroup) {
            const int64_t e = chosen[j];
            if (e < 0 || e >= E) {
                RecordIndexError(err, IndexErrorKind::kMoeTopkBackward, e, r * k + j, E, 0);
                bad = 1;
            }
        }
        bad = GroupReduce(bad, SumOp());
        const bool ok = live && bad == 0;
        const int64_t kk = ok ? k : 0, len = ok ? E : 0;
        double m = -INFINITY, denom = 0, dot = 0;
        if (normalize) {
            for (int64_t j = lane; j < kk; j += kGroup) m = fmax(m, LoadD(x + chosen[j]));
            m = GroupReduce(m, FmaxOp());
            for (int64_t j = lane; j < kk; j += kGroup) denom = AddRn(denom, exp(LoadD(x + chosen[j]) - m));
            denom = GroupReduce(denom, SumOp());
            for (int64_t j = lane; j < kk; j += kGroup) {
                const double p = exp(LoadD(x + chosen[j]) - m) / denom;
                dot = AddRn(dot, MulRn(static_cast<double>(g[j]), p));
            }
            dot = GroupReduce(dot, SumOp());
            for (int64_t i = lane; i < len; i += kGroup) {
                double dl = 0;
                for (int64_t j = 0; j < kk; ++j) {
                    if (chosen[j] != i) continue;
                    const double p = exp(LoadD(x + i) - m) / denom;
                    dl = AddRn(dl, MulRn(p, static_cast<double>(g[j]) - dot));
                }
                dlogits[r * E + i] = StoreD<T>(dl);
            }
        } else {
            for (int64_t i = lane; i < len; i += kGroup) m = fmax(m, LoadD(x + i));
            m = GroupReduce(m, FmaxOp());
            for (int64_t i = lane; i < len; i += kGroup) denom = AddRn(denom, exp(LoadD(x + i) - m));
            denom = GroupReduce(denom, SumOp());
            for (int64_t j = lane; j < kk; j += kGroup) {
                const double p = exp(LoadD(x + chosen[j]) - m) / denom;
                dot = AddRn(dot, MulRn(static_cast<double>(g[j]), p));
            }
            dot = GroupReduce(dot, SumOp());
            for (int64_t i = lane; i < len; i += kGroup) {
                const double p = exp(LoadD(x + i) - m) / denom;
                double dl = MulRn(-p, dot);
                for (int64_t j = 0; j < kk; ++j) {
                    if (chosen[j] == i) dl = AddRn(dl, MulRn(p, static_cast<double>(g[j])));
                }
                dlogits[r * E + i] = StoreD<T>(dl);
            }
        }
        if (live && !ok) {
            for (int64_t i = lane; i < E; i += kGroup) dlogits[r * E + i] = StoreD<T>(NAN);
        }
    }
}

// ---- moe_permute ---------------------------------------------------------------------------

// Loads chunk c's expert ids into sh (-1 for ids outside [0, E), recorded when `err` is set); returns its length.
__device__ __forceinline__ int LoadMoeChunk(const int64_t* __restrict__ experts, int64_t S, int64_t E, int64_t c,
                                            int32_t* sh, DeviceErrorRecord* err) {
    const int64_t start = c * kMoeChunk;
    const int len = static_cast<int>(S - start < kMoeChunk ? S - start : kMoeChunk);
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const int64_t e = experts[start + i];
        const bool in_range = e >= 0 && e < E;
        if (!in_range && err) RecordIndexError(err, IndexErrorKind::kMoePermute, e, start + i, E, 0);
        sh[i] = in_range ? static_cast<int32_t>(e) : -1;
    }
    return len;
}

// A block per chunk: chunk_counts[e * chunks + c] = slots of chunk c routed to expert e.
__global__ void MoeCountKernel(const int64_t* __restrict__ experts, int64_t S, int64_t E, int64_t chunks,
                               int64_t* __restrict__ chunk_counts, DeviceErrorRecord* err) {
    __shared__ int32_t sh[kMoeChunk];
    for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
        __syncthreads();  // the previous chunk's readers are done
        const int len = LoadMoeChunk(experts, S, E, c, sh, err);
        __syncthreads();
        for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
            int64_t n = 0;
            for (int i = 0; i < len; ++i) n += sh[i] == e;
            chunk_counts[e * chunks + c] = n;
        }
    }
}

// One block: offsets = the exclusive scan of chunk_counts [E, chunks] (flattened), counts[e] = rows of expert e.
__global__ void MoeScanKernel(const int64_t* __restrict__ chunk_counts, int64_t E, int64_t chunks,
                              int64_t* __restrict__ offsets, int64_t* __restrict__ counts) {
    __shared__ int64_t part[1024];
    const int64_t M = E * chunks, nt = blockDim.x, t = threadIdx.x;
    const int64_t per = (M + nt - 1) / nt, lo = t * per < M ? t * per : M, hi = lo + per < M ? lo + per : M;
    int64_t sum = 0;
    for (int64_t i = lo; i < hi; ++i) sum += chunk_counts[i];
    part[t] = sum;
    __syncthreads();
    for (int64_t o = 1; o < nt; o <<= 1) {  // inclusive Hillis-Steele scan of the per-thread sums
        const int64_t add = t >= o ? part[t - o] : 0;
        __syncthreads();
        part[t] += add;
        __syncthreads();
    }
    int64_t run = t > 0 ? part[t - 1] : 0;
    const int64_t total = part[nt - 1];
    for (int64_t i = lo; i < hi; ++i) {
        offsets[i] = run;
        run += chunk_counts[i];
    }
    __syncthreads();  // offsets written by other threads are visible below
    for (int64_t e = t; e < E; e += nt) {
        const int64_t end = e + 1 < E ? offsets[(e + 1) * chunks] : total;
        counts[e] = end - offsets[e * chunks];
    }
}

// A block per chunk, a thread per expert walking the chunk in slot order: source[offset++] = slot (stable).
__global__ void MoePlaceKernel(const int64_t* __restrict__ experts, int64_t S, int64_t E, int64_t chunks,
                               const int64_t* __restrict__ offsets, int64_t* __restrict__ source) {
    __shared__ int32_t sh[kMoeChunk];
    for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
        __syncthreads();
        const int len = LoadMoeChunk(experts, S, E, c, sh, nullptr);
        __syncthreads();
        const int64_t start = c * kMoeChunk;
        for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
            int64_t at = offsets[e * chunks + c];
            for (int i = 0; i < len; ++i) {
                if (sh[i] == e) source[at++] = start + i;
            }
        }
    }
}

// out[r, c] = x[source[r] / k, c]; NaN for a row no slot reached (bad experts).
template <typename T>
__global__ void MoeGatherRowsKernel(const T* __restrict__ x, const int64_t* __restrict__ source, T* __restrict__ out,
                                    int64_t S, int64_t C, int64_t k) {
    GPU_KERNEL_LOOP(i, S * C) {
        const int64_t r = i / C, c = i - r * C, s = source[r];
        out[i] = s >= 0 && s < S ? x[(s / k) * C + c] : StoreD<T>(NAN);
    }
}

// ---- moe_unpermute and its backward ---------------------------------------------------------------

// pos[source[r]] = r; mark [S] zero and pos [S] -1 on entry. A source outside [0, S) or repeated is recorded.
__global__ void MoeInverseKernel(const int64_t* __restrict__ source, int64_t S, unsigned int* __restrict__ mark,
                                 int64_t* __restrict__ pos, IndexErrorKind kind, DeviceErrorRecord* err) {
    GPU_KERNEL_LOOP(r, S) {
        const int64_t s = source[r];
        if (s < 0 || s >= S || atomicCAS(mark + s, 0u, 1u) != 0u) {
            RecordIndexError(err, kind, s, r, S, 0);
        } else {
            pos[s] = r;
        }
    }
}

// out[n, c] = sum_j w[n, j] * y[pos[n*k + j], c], in j order; NaN where a slot has no row.
template <typename T>
__global__ void MoeCombineKernel(const T* __restrict__ y, const int64_t* __restrict__ pos, const Acc<T>* __restrict__ w,
                                 T* __restrict__ out, int64_t N, int64_t C, int64_t k) {
    GPU_KERNEL_LOOP(i, N * C) {
        const int64_t n = i / C, c = i - n * C;
        double acc = 0;
        for (int64_t j = 0; j < k; ++j) {
            const int64_t p = pos[n * k + j];
            acc = p < 0 ? NAN : AddRn(acc, MulRn(static_cast<double>(w[n * k + j]), LoadD(y + p * C + c)));
        }
        out[i] = StoreD<T>(acc);
    }
}

// dy[r, c] = w[s] * grad[s / k, c], s = source[r]; NaN for a source outside [0, S).
template <typename T>
__global__ void MoeCombineBackwardDyKernel(const T* __restrict__ grad, const int64_t* __restrict__ source,
                                           const Acc<T>* __restrict__ w, T* __restrict__ dy, int64_t S, int64_t C,
                                           int64_t k) {
    GPU_KERNEL_LOOP(i, S * C) {
        const int64_t r = i / C, c = i - r * C, s = source[r];
        dy[i] = s >= 0 && s < S ? StoreD<T>(MulRn(static_cast<double>(w[s]), LoadD(grad + (s / k) * C + c)))
                                : StoreD<T>(NAN);
    }
}

// A 32-lane group per slot s: dw[s] = grad[s / k] . y[pos[s]] (NaN when no row has source s).
template <typename T>
__global__ void MoeCombineBackwardDwKernel(const T* __restrict__ grad, const T* __restrict__ y,
                                           const int64_t* __restrict__ pos, Acc<T>* __restrict__ dw, int64_t S,
                                           int64_t C, int64_t k) {
    const int lane = threadIdx.x % kGroup;
    const int64_t per_block = blockDim.x / kGroup;
    GPU_BLOCK_ROWS_LOOP(base, S, per_block) {
        const int64_t slot = base + threadIdx.x / kGroup;
        const bool live = slot < S;
        const int64_t s = live ? slot : 0, r = pos[s];
        const int64_t len = live && r >= 0 ? C : 0;
        const T* g = grad + (s / k) * C;
        const T* yr = y + (r >= 0 ? r : 0) * C;
        double dot = 0;
        for (int64_t c = lane; c < len; c += kGroup) dot = AddRn(dot, MulRn(LoadD(g + c), LoadD(yr + c)));
        dot = GroupReduce(dot, SumOp());
        if (live && lane == 0) dw[s] = static_cast<Acc<T>>(r >= 0 ? dot : NAN);
    }
}

}  // namespace infinitrain::gpu
