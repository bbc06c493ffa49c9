// Fused (flash) attention: sdpa and sdpa_backward without the [T, S] score matrix.
//   Semantics of attention.cuh's sdpa: q [B, Hq, T, D], k, v [B, Hkv, S, D] contiguous, query head h reads kv head
//   h / (Hq / Hkv); out [B, Hq, T, D] in q's dtype; lse [B, Hq, T] float32, the natural-log sum-exp of the row of
//   scaled scores; causal masks key s > query t (causal implies T == S); a row without keys (S == 0) gets lse -inf
//   and out 0.
//   Forward: a block per (b * Hq, query tile) walks the key tiles (causal: only up to the diagonal) with an online
//   softmax (running max and sum per row); only tiles live in shared memory, accumulators in registers.
//   Backward, without atomics (deterministic): D = rowsum(dO * out) (float32 scratch [B * Hq * T]); a block per
//   (b * Hkv, key tile) walks the query tiles of the kv head's g query heads accumulating dK, dV; a block per
//   (b * Hq, query tile) walks the key tiles accumulating dQ. Both recompute P = exp(scale q.k - lse) and
//   dS = P * (dO.v - D); dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
// Policies, chosen at compile time (FlashPolicy):
//   kTileMma: bfloat16/float16 where the vendor header declares kHasTileMma and a TileMma (one 32-lane warp computes
//     C[16x16] f32 += A[16x16] B[16x16] 16-bit; per-lane fragments whose elements' (row, col) its index functions
//     give). Fragments are loaded from shared memory through those functions and the softmax reads rows through
//     C's, so any layout satisfying the static_asserts below works. P and dS are rounded to the input type before
//     their products (tensor cores take 16-bit operands). A warp owns 16 rows; 4 warps a block.
//   kSimt: float32 FMAs on any vendor (float32 inputs; 16-bit ones where there is no TileMma); P and dS stay
//     float32. A row is shared by kD / 16 lanes of a 32-lane group (shuffles of width 32), so 64-lane warps work.
//   kTileMmaStaged: kTileMma with P and dS passed to A fragments through shared memory, as on a vendor whose C and
//     A fragment layouts differ (a test of that path).
// Precision: float32 compute and accumulation; exponentials are exp2 of log2(e)-scaled scores; one rounding per
// output. Launchers return false (the caller keeps the GEMM path) for float64, D not in {32, 64, 128}, pointers not
// 16-byte aligned or shapes past the grid limits.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

// Declared for vendors without one: the tensor-core kernels then parse but are never instantiated.
struct TileMma;

enum class FlashPolicy { kTileMma, kTileMmaStaged, kSimt };

template <typename T>
constexpr FlashPolicy DefaultFlashPolicy() {
    return kHasTileMma && !std::is_same<T, float>::value ? FlashPolicy::kTileMma : FlashPolicy::kSimt;
}

namespace flash {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kBlockThreads = 128;

// ---- 4-element vector loads and stores (float4, or 8 bytes of 16-bit values) --------------------------------

__device__ __forceinline__ float4 Load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
template <typename H>
__device__ __forceinline__ float4 Load4(const H* p) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    H h[4];
    memcpy(h, &u, 8);
    return make_float4(ToAcc(h[0]), ToAcc(h[1]), ToAcc(h[2]), ToAcc(h[3]));
}
__device__ __forceinline__ void Store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
template <typename H>
__device__ __forceinline__ void Store4(H* p, float4 v) {
    H h[4] = {FromAcc<H>(v.x), FromAcc<H>(v.y), FromAcc<H>(v.z), FromAcc<H>(v.w)};
    uint2 u;
    memcpy(&u, h, 8);
    *reinterpret_cast<uint2*>(p) = u;
}

// D[r] = sum_e dO[r, e] * out[r, e]: a 32-lane group per row.
template <typename T, int kD>
__global__ void __launch_bounds__(kBlockThreads)
    RowDotKernel(const T* __restrict__ dout, const T* __restrict__ out, float* __restrict__ d, int64_t rows) {
    const int lane = threadIdx.x % kGroup;
    const int64_t sub = threadIdx.x / kGroup;
    GPU_BLOCK_ROWS_LOOP(base, rows, kBlockThreads / kGroup) {
        const int64_t r = base + sub;
        float acc = 0;
        if (r < rows) {
            for (int c = lane; c < kD / 4; c += kGroup) {
                const float4 a = Load4(dout + r * kD + 4 * c), b = Load4(out + r * kD + 4 * c);
                acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
        }
        acc = GroupReduce(acc, SumOp());
        if (r < rows && lane == 0) d[r] = acc;
    }
}

// Where a block's heads start: query head bh = b * Hq + h reads kv head b * Hkv + h / g.
__device__ __forceinline__ int64_t KvHead(int64_t bh, int Hq, int g) { return bh / Hq * (Hq / g) + bh % Hq / g; }

// ============================== SIMT policy ==============================

// A row (query or key) is held by kL = kD / 16 consecutive lanes, lane j holding the float4 chunks j + kL * u
// (u < 4) of it: 16 floats per lane per row vector. Streamed rows live in shared memory as float.
template <int kD>
struct SimtCfg {
    static constexpr int kL = kD / 16;
    static constexpr int kRows = kBlockThreads / kL;  // rows a block owns
    static constexpr int kTile = 32;                  // streamed rows per shared tile
    static constexpr int kChunk = 4;    // rows a backward step takes at once (their shared rows stay in registers)
    static constexpr int kLd = kD + 4;  // floats per shared row: 16-byte aligned
};

template <int kL>
__device__ __forceinline__ float RowSum(float x) {
#pragma unroll
    for (int o = 1; o < kL; o <<= 1) x += __shfl_xor_sync(kFullLaneMask, x, o, kGroup);
    return x;
}

// Rows [r0, r0 + n) of a [*, kD] matrix into shared floats, zero at rows >= limit.
template <int kD, int kLd, typename T>
__device__ __forceinline__ void LoadTileF(float* s, const T* src, int r0, int n, int limit) {
    constexpr int kC = kD / 4;
    for (int idx = threadIdx.x; idx < n * kC; idx += kBlockThreads) {
        const int r = idx / kC, c = idx % kC;
        const float4 v = r0 + r < limit ? Load4(src + static_cast<int64_t>(r0 + r) * kD + 4 * c) : float4{0, 0, 0, 0};
        *reinterpret_cast<float4*>(s + r * kLd + 4 * c) = v;
    }
}

template <int kL, typename T>
__device__ __forceinline__ void LoadRow(float (&x)[16], const T* row, int j, bool valid, float mul) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const float4 v = valid ? Load4(row + 4 * (j + kL * u)) : float4{0, 0, 0, 0};
        x[4 * u] = v.x * mul, x[4 * u + 1] = v.y * mul, x[4 * u + 2] = v.z * mul, x[4 * u + 3] = v.w * mul;
    }
}

template <int kL, typename T>
__device__ __forceinline__ void StoreRow(T* row, const float (&x)[16], int j, float mul) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        Store4(row + 4 * (j + kL * u),
               float4{x[4 * u] * mul, x[4 * u + 1] * mul, x[4 * u + 2] * mul, x[4 * u + 3] * mul});
    }
}

// This lane's part of the dot product of x with shared row s.
template <int kL>
__device__ __forceinline__ float DotPart(const float (&x)[16], const float* s, int j) {
    float acc = 0;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const float4 v = *reinterpret_cast<const float4*>(s + 4 * (j + kL * u));
        acc += x[4 * u] * v.x + x[4 * u + 1] * v.y + x[4 * u + 2] * v.z + x[4 * u + 3] * v.w;
    }
    return acc;
}

// x += a * shared row s (this lane's chunks).
template <int kL>
__device__ __forceinline__ void Axpy(float (&x)[16], float a, const float* s, int j) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const float4 v = *reinterpret_cast<const float4*>(s + 4 * (j + kL * u));
        x[4 * u] += a * v.x, x[4 * u + 1] += a * v.y, x[4 * u + 2] += a * v.z, x[4 * u + 3] += a * v.w;
    }
}

// Grid (b * Hq, query tiles, last tile first: causal's longest rows start early).
template <typename T, int kD>
__global__ void __launch_bounds__(kBlockThreads)
    FwdSimt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
            float* __restrict__ lse, int Hq, int g, int Tn, int S, bool causal, float sl2) {
    using C = SimtCfg<kD>;
    __shared__ __align__(16) float sK[C::kTile * C::kLd];
    __shared__ __align__(16) float sV[C::kTile * C::kLd];
    const int64_t bh = blockIdx.x, kvh = KvHead(bh, Hq, g);
    const int r0 = (gridDim.y - 1 - blockIdx.y) * C::kRows;
    const int j = threadIdx.x % C::kL, row = r0 + threadIdx.x / C::kL;
    const bool valid = row < Tn;
    const T* kb = k + kvh * S * kD;
    const T* vb = v + kvh * S * kD;
    float qr[16], o[16];
    LoadRow<C::kL>(qr, q + (bh * Tn + (valid ? row : 0)) * kD, j, valid, sl2);
#pragma unroll
    for (int e = 0; e < 16; ++e) o[e] = 0;
    float m = -INFINITY, l = 0;
    const int kend = causal ? min(S, r0 + C::kRows) : S;
    for (int k0 = 0; k0 < kend; k0 += C::kTile) {
        __syncthreads();
        LoadTileF<kD, C::kLd>(sK, kb, k0, C::kTile, S);
        LoadTileF<kD, C::kLd>(sV, vb, k0, C::kTile, S);
        __syncthreads();
        float s[C::kTile];
        float mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < C::kTile; ++c) s[c] = DotPart<C::kL>(qr, sK + c * C::kLd, j);
#pragma unroll
        for (int c = 0; c < C::kTile; ++c) {
            s[c] = RowSum<C::kL>(s[c]);
            const int key = k0 + c;
            if (key >= S || (causal && key > row)) s[c] = -INFINITY;
            mx = fmaxf(mx, s[c]);
        }
        const float mn = fmaxf(m, mx), base = mn == -INFINITY ? 0.f : mn, alpha = exp2f(m - base);
        m = mn;
        l *= alpha;
#pragma unroll
        for (int e = 0; e < 16; ++e) o[e] *= alpha;
#pragma unroll
        for (int c = 0; c < C::kTile; ++c) {
            const float p = exp2f(s[c] - base);
            l += p;
            Axpy<C::kL>(o, p, sV + c * C::kLd, j);
        }
    }
    if (valid) {
        StoreRow<C::kL>(out + (bh * Tn + row) * kD, o, j, l > 0 ? 1.f / l : 0.f);
        if (j == 0) lse[bh * Tn + row] = l > 0 ? m * kLn2 + logf(l) : -INFINITY;
    }
}

// Grid (b * Hq, query tiles, last first); dQ of this block's rows over all (causal: earlier) keys.
template <typename T, int kD>
__global__ void __launch_bounds__(kBlockThreads)
    DqSimt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
           const float* __restrict__ lse, const float* __restrict__ dsum, T* __restrict__ dq, int Hq, int g, int Tn,
           int S, bool causal, float sl2, float scale) {
    using C = SimtCfg<kD>;
    __shared__ __align__(16) float sK[C::kTile * C::kLd];
    __shared__ __align__(16) float sV[C::kTile * C::kLd];
    const int64_t bh = blockIdx.x, kvh = KvHead(bh, Hq, g);
    const int r0 = (gridDim.y - 1 - blockIdx.y) * C::kRows;
    const int j = threadIdx.x % C::kL, row = r0 + threadIdx.x / C::kL;
    const bool valid = row < Tn;
    const int64_t off = (bh * Tn + (valid ? row : 0)) * kD;
    const T* kb = k + kvh * S * kD;
    const T* vb = v + kvh * S * kD;
    float qr[16], dor[16], acc[16];
    LoadRow<C::kL>(qr, q + off, j, valid, sl2);
    LoadRow<C::kL>(dor, dout + off, j, valid, 1.f);
#pragma unroll
    for (int e = 0; e < 16; ++e) acc[e] = 0;
    const float lse2 = valid ? lse[bh * Tn + row] * kLog2e : 0.f, drow = valid ? dsum[bh * Tn + row] : 0.f;
    const int kend = causal ? min(S, r0 + C::kRows) : S;
    for (int k0 = 0; k0 < kend; k0 += C::kTile) {
        __syncthreads();
        LoadTileF<kD, C::kLd>(sK, kb, k0, C::kTile, S);
        LoadTileF<kD, C::kLd>(sV, vb, k0, C::kTile, S);
        __syncthreads();
        // Chunks of kChunk keys: enough independent dot products in flight, few registers.
#pragma unroll 1
        for (int c0 = 0; c0 < C::kTile; c0 += C::kChunk) {
            float s[C::kChunk], dp[C::kChunk];
#pragma unroll
            for (int c = 0; c < C::kChunk; ++c) {
                s[c] = DotPart<C::kL>(qr, sK + (c0 + c) * C::kLd, j);
                dp[c] = DotPart<C::kL>(dor, sV + (c0 + c) * C::kLd, j);
            }
#pragma unroll
            for (int c = 0; c < C::kChunk; ++c) {
                const float sc = RowSum<C::kL>(s[c]), dpc = RowSum<C::kL>(dp[c]);
                const int key = k0 + c0 + c;
                const float p = key >= S || (causal && key > row) ? 0.f : exp2f(sc - lse2);
                Axpy<C::kL>(acc, p * (dpc - drow), sK + (c0 + c) * C::kLd, j);
            }
        }
    }
    if (valid) StoreRow<C::kL>(dq + off, acc, j, scale);
}

// Grid (b * Hkv, key tiles); dK, dV of this block's keys over the g query heads' (causal: later) queries.
template <typename T, int kD>
__global__ void __launch_bounds__(kBlockThreads)
    DkvSimt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
            const float* __restrict__ lse, const float* __restrict__ dsum, T* __restrict__ dk, T* __restrict__ dv,
            int Hkv, int g, int Tn, int S, bool causal, float sl2, float scale) {
    using C = SimtCfg<kD>;
    __shared__ __align__(16) float sQ[C::kTile * C::kLd];
    __shared__ __align__(16) float sO[C::kTile * C::kLd];
    __shared__ float sL[C::kTile], sD[C::kTile];
    const int64_t bkv = blockIdx.x;
    const int r0 = blockIdx.y * C::kRows;
    const int j = threadIdx.x % C::kL, key = r0 + threadIdx.x / C::kL;
    const bool valid = key < S;
    const int64_t off = (bkv * S + (valid ? key : 0)) * kD;
    float kr[16], vr[16], dkr[16], dvr[16];
    LoadRow<C::kL>(kr, k + off, j, valid, sl2);
    LoadRow<C::kL>(vr, v + off, j, valid, 1.f);
#pragma unroll
    for (int e = 0; e < 16; ++e) dkr[e] = 0, dvr[e] = 0;
    const int qstart = causal ? r0 / C::kTile * C::kTile : 0;
    for (int hh = 0; hh < g; ++hh) {
        const int64_t bh = bkv / Hkv * (static_cast<int64_t>(Hkv) * g) + bkv % Hkv * g + hh;
        const T* qb = q + bh * Tn * kD;
        const T* ob = dout + bh * Tn * kD;
        for (int q0 = qstart; q0 < Tn; q0 += C::kTile) {
            __syncthreads();
            LoadTileF<kD, C::kLd>(sQ, qb, q0, C::kTile, Tn);
            LoadTileF<kD, C::kLd>(sO, ob, q0, C::kTile, Tn);
            if (threadIdx.x < C::kTile) {
                const int t = q0 + threadIdx.x;
                sL[threadIdx.x] = t < Tn ? lse[bh * Tn + t] * kLog2e : INFINITY;  // no query: p = 0
                sD[threadIdx.x] = t < Tn ? dsum[bh * Tn + t] : 0.f;
            }
            __syncthreads();
#pragma unroll 1
            for (int c0 = 0; c0 < C::kTile; c0 += C::kChunk) {
                float s[C::kChunk], dp[C::kChunk];
#pragma unroll
                for (int c = 0; c < C::kChunk; ++c) {
                    s[c] = DotPart<C::kL>(kr, sQ + (c0 + c) * C::kLd, j);
                    dp[c] = DotPart<C::kL>(vr, sO + (c0 + c) * C::kLd, j);
                }
#pragma unroll
                for (int c = 0; c < C::kChunk; ++c) {
                    const int t = c0 + c;
                    const float sc = RowSum<C::kL>(s[c]), dpc = RowSum<C::kL>(dp[c]);
                    const float p = causal && key > q0 + t ? 0.f : exp2f(sc - sL[t]);
                    Axpy<C::kL>(dvr, p, sO + t * C::kLd, j);
                    Axpy<C::kL>(dkr, p * (dpc - sD[t]), sQ + t * C::kLd, j);
                }
            }
        }
    }
    if (valid) {
        StoreRow<C::kL>(dk + off, dkr, j, scale);
        StoreRow<C::kL>(dv + off, dvr, j, 1.f);
    }
}

// ============================== tensor-core policy ==============================

// Compile-time facts about a TileMma's fragment layout. Roles: 0 A (row, k), 1 B (k, col), 2 C (row, col).
template <class M>
struct Layout {
    static constexpr int kE = M::kElems;
    template <int kRole>
    __host__ __device__ static constexpr int Row(int l, int i) {
        return kRole == 0 ? M::ARow(l, i) : kRole == 1 ? M::BRow(l, i) : M::CRow(l, i);
    }
    template <int kRole>
    __host__ __device__ static constexpr int Col(int l, int i) {
        return kRole == 0 ? M::ACol(l, i) : kRole == 1 ? M::BCol(l, i) : M::CCol(l, i);
    }
    // Elements 2j, 2j + 1 are neighbours in memory (one 32-bit access) for a matrix with element (r, c) at
    // r * ld + c (kColMajor: c * ld + r), ld even.
    template <int kRole, bool kColMajor>
    __host__ __device__ static constexpr bool PairsAdjacent() {
        if (kE % 2) return false;
        for (int l = 0; l < 32; ++l) {
            for (int i = 0; i < kE; i += 2) {
                const int r = Row<kRole>(l, i), c = Col<kRole>(l, i);
                const int r1 = Row<kRole>(l, i + 1), c1 = Col<kRole>(l, i + 1);
                if (kColMajor ? (r % 2 || c1 != c || r1 != r + 1) : (c % 2 || r1 != r || c1 != c + 1)) return false;
            }
        }
        return true;
    }
    // C fragments are A fragments element for element: P goes from a product's result to the next operand in
    // registers.
    __host__ __device__ static constexpr bool CIsA() {
        for (int l = 0; l < 32; ++l) {
            for (int i = 0; i < kE; ++i) {
                if (M::CRow(l, i) != M::ARow(l, i) || M::CCol(l, i) != M::ACol(l, i)) return false;
            }
        }
        return true;
    }
    // The first element of a lane holding the same C row as element i (the same on every lane: checked below).
    __host__ __device__ static constexpr int CRep(int i) {
        for (int j = 0; j < i; ++j) {
            if (M::CRow(0, j) == M::CRow(0, i)) return j;
        }
        return i;
    }
    __host__ __device__ static constexpr bool CRowPatternUniform() {
        for (int l = 0; l < 32; ++l) {
            for (int i = 0; i < kE; ++i) {
                for (int j = 0; j < kE; ++j) {
                    if ((M::CRow(l, i) == M::CRow(l, j)) != (M::CRow(0, i) == M::CRow(0, j))) return false;
                }
            }
        }
        return true;
    }
    // The lane-index bits o with CRow(l ^ o, i) == CRow(l, i) for all l, i: a row's lanes are an xor class.
    __host__ __device__ static constexpr int CRowXorBits() {
        int bits = 0;
        for (int o = 1; o < 32; o <<= 1) {
            bool keep = true;
            for (int l = 0; l < 32; ++l) {
                for (int i = 0; i < kE; ++i) keep = keep && M::CRow(l ^ o, i) == M::CRow(l, i);
            }
            if (keep) bits |= o;
        }
        return bits;
    }
    __host__ __device__ static constexpr bool CRowsInXorClass() {
        for (int l = 0; l < 32; ++l) {
            for (int l2 = 0; l2 < 32; ++l2) {
                for (int i = 0; i < kE; ++i) {
                    for (int j = 0; j < kE; ++j) {
                        if (M::CRow(l, i) == M::CRow(l2, j) && ((l ^ l2) & ~CRowXorBits())) return false;
                    }
                }
            }
        }
        return true;
    }
};

// What the tensor-core kernels rely on; every TileMma must satisfy it.
template <class M>
struct LayoutChecks {
    using L = Layout<M>;
    static_assert(L::CRowPatternUniform(), "TileMma: elements sharing a C row must be the same on every lane");
    static_assert(L::CRowsInXorClass(), "TileMma: the lanes sharing a C row must differ only in xor-closed bits");
    static constexpr bool kOk = true;
};

template <class M, int kRole, bool kColMajor, typename T>
__device__ __forceinline__ void LoadFrag(T (&f)[M::kElems], const T* p, int ld, int lane) {
    using L = Layout<M>;
    if constexpr (L::template PairsAdjacent<kRole, kColMajor>()) {
#pragma unroll
        for (int i = 0; i < M::kElems; i += 2) {
            const int r = L::template Row<kRole>(lane, i), c = L::template Col<kRole>(lane, i);
            const uint32_t u = *reinterpret_cast<const uint32_t*>(p + (kColMajor ? c * ld + r : r * ld + c));
            memcpy(&f[i], &u, 4);
        }
    } else {
#pragma unroll
        for (int i = 0; i < M::kElems; ++i) {
            const int r = L::template Row<kRole>(lane, i), c = L::template Col<kRole>(lane, i);
            f[i] = p[kColMajor ? c * ld + r : r * ld + c];
        }
    }
}

// Reduces x over each C row of the warp's 16 rows; every element gets its row's result.
template <class M, typename Op>
__device__ __forceinline__ void RowReduce(float (&x)[M::kElems], Op op) {
    using L = Layout<M>;
    static_assert(LayoutChecks<M>::kOk, "");
#pragma unroll
    for (int i = 0; i < M::kElems; ++i) {
        if (L::CRep(i) != i) x[L::CRep(i)] = op(x[L::CRep(i)], x[i]);
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        if (L::CRowXorBits() & o) {
#pragma unroll
            for (int i = 0; i < M::kElems; ++i) {
                if (L::CRep(i) == i) x[i] = op(x[i], __shfl_xor_sync(kFullLaneMask, x[i], o, kGroup));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < M::kElems; ++i) x[i] = x[L::CRep(i)];
}

struct MaxF {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumF {
    __device__ float operator()(float a, float b) const { return a + b; }
};

// acc[n] += A B for A the 16 x kK rows at a (element (r, e) at a[r * lda + e]) and B (kK x 16 kN) the transpose of
// the 16 kN rows at b (element (e, n) at b[n * ldb + e]): q k^T, dO v^T and their transposes.
template <class M, int kK, int kN, typename T>
__device__ __forceinline__ void MmaABt(float (&acc)[kN][M::kElems], const T* a, int lda, const T* b, int ldb,
                                       int lane) {
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
        T fa[M::kElems];
        LoadFrag<M, 0, false>(fa, a + kk * 16, lda, lane);
#pragma unroll
        for (int n = 0; n < kN; ++n) {
            T fb[M::kElems];
            LoadFrag<M, 1, true>(fb, b + n * 16 * ldb + kk * 16, ldb, lane);
            M::Run(acc[n], fa, fb);
        }
    }
}

// Shared staging of one 16x16 16-bit tile per warp (P or dS on its way from C to A fragments).
constexpr int kStageLd = 24;

// acc[n] += P B for P (16 x 16 kK) in C fragments p[kk], rounded to T, and B (16 kK x 16 kN) with element (e, n)
// at b[e * ldb + n]: P V, dS K, P^T dO, dS^T Q.
template <class M, bool kDirect, int kK, int kN, typename T>
__device__ __forceinline__ void MmaPB(float (&acc)[kN][M::kElems], const float (&p)[kK][M::kElems], const T* b, int ldb,
                                      T* stage, int lane) {
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
        T fa[M::kElems];
        if constexpr (kDirect) {
#pragma unroll
            for (int i = 0; i < M::kElems; ++i) fa[i] = FromAcc<T>(p[kk][i]);
        } else {
            // Block barriers (every warp takes the same steps): __syncwarp is not among the vendor-neutral built-ins.
            __syncthreads();
#pragma unroll
            for (int i = 0; i < M::kElems; ++i) {
                stage[M::CRow(lane, i) * kStageLd + M::CCol(lane, i)] = FromAcc<T>(p[kk][i]);
            }
            __syncthreads();
            LoadFrag<M, 0, false>(fa, stage, kStageLd, lane);
        }
#pragma unroll
        for (int n = 0; n < kN; ++n) {
            T fb[M::kElems];
            LoadFrag<M, 1, false>(fb, b + kk * 16 * ldb + n * 16, ldb, lane);
            M::Run(acc[n], fa, fb);
        }
    }
}

// Rows [r0, r0 + n) of a [*, kD] 16-bit matrix into shared memory (rows of kLd), 16 bytes a thread, zero at rows
// >= limit.
template <int kD, int kLd, typename T>
__device__ __forceinline__ void LoadTileH(T* s, const T* src, int r0, int n, int limit) {
    constexpr int kC = kD / 8;
    for (int idx = threadIdx.x; idx < n * kC; idx += kBlockThreads) {
        const int r = idx / kC, c = idx % kC;
        const uint4 v = r0 + r < limit
                            ? *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(r0 + r) * kD + 8 * c)
                            : uint4{0, 0, 0, 0};
        *reinterpret_cast<uint4*>(s + r * kLd + 8 * c) = v;
    }
}

// Stores the warp's 16 x 16 kN C fragments acc * mul to rows [row0, row0 + 16) of a [*, kD] matrix (rows < limit).
template <class M, int kN, int kD, typename T>
__device__ __forceinline__ void StoreC(T* dst, const float (&acc)[kN][M::kElems], const float (&mul)[M::kElems],
                                       int row0, int limit, int lane) {
    using L = Layout<M>;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
        if constexpr (L::template PairsAdjacent<2, false>()) {
#pragma unroll
            for (int i = 0; i < M::kElems; i += 2) {
                const int r = row0 + M::CRow(lane, i);
                if (r < limit) {
                    T h[2] = {FromAcc<T>(acc[n][i] * mul[i]), FromAcc<T>(acc[n][i + 1] * mul[i + 1])};
                    uint32_t u;
                    memcpy(&u, h, 4);
                    *reinterpret_cast<uint32_t*>(dst + static_cast<int64_t>(r) * kD + n * 16 + M::CCol(lane, i)) = u;
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < M::kElems; ++i) {
                const int r = row0 + M::CRow(lane, i);
                if (r < limit) {
                    dst[static_cast<int64_t>(r) * kD + n * 16 + M::CCol(lane, i)] = FromAcc<T>(acc[n][i] * mul[i]);
                }
            }
        }
    }
}

// Tiles per kernel: a warp owns 16 rows, 4 warps a block; streamed tiles shrink for kD = 128 to stay within 48 KiB
// of static shared memory and in registers.
template <int kD>
struct TcCfg {
    static constexpr int kLd = kD + 8;  // 16-bit elements per shared row: 16-byte rows, banks shifted by 4 a row
    static constexpr int kRows = 16 * kBlockThreads / 32;
    static constexpr int kFwdKeys = kD <= 64 ? 64 : 32;
    static constexpr int kDqKeys = kD <= 64 ? 64 : 16;
    static constexpr int kDkvQueries = kD <= 64 ? 64 : 16;
};

template <class M, bool kStage>
__host__ __device__ constexpr bool Direct() {
    return !kStage && Layout<M>::CIsA();
}

// Grid (b * Hq, query tiles, last first).
template <class M, bool kStage, typename T, int kD>
__global__ void __launch_bounds__(kBlockThreads)
    FwdTc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
          float* __restrict__ lse, int Hq, int g, int Tn, int S, bool causal, float sl2) {
    using Cf = TcCfg<kD>;
    constexpr int kE = M::kElems, kBr = Cf::kRows, kBc = Cf::kFwdKeys, kLd = Cf::kLd;
    constexpr bool kDirect = Direct<M, kStage>();
    __shared__ __align__(16) T sQ[kBr * kLd];
    __shared__ __align__(16) T sK[kBc * kLd];
    __shared__ __align__(16) T sV[kBc * kLd];
    __shared__ __align__(16) T sStage[kDirect ? 1 : kBlockThreads / 32 * 16 * kStageLd];
    const int64_t bh = blockIdx.x, kvh = KvHead(bh, Hq, g);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wrow = q0 + warp * 16;
    const T* kb = k + kvh * S * kD;
    const T* vb = v + kvh * S * kD;
    T* stage = sStage + (kDirect ? 0 : warp * 16 * kStageLd);
    LoadTileH<kD, kLd>(sQ, q + bh * Tn * kD, q0, kBr, Tn);
    float o[kD / 16][kE], m[kE], l[kE];
#pragma unroll
    for (int i = 0; i < kE; ++i) {
        m[i] = -INFINITY, l[i] = 0;
#pragma unroll
        for (int n = 0; n < kD / 16; ++n) o[n][i] = 0;
    }
    const int kend = causal ? min(S, q0 + kBr) : S;
    for (int k0 = 0; k0 < kend; k0 += kBc) {
        __syncthreads();
        LoadTileH<kD, kLd>(sK, kb, k0, kBc, S);
        LoadTileH<kD, kLd>(sV, vb, k0, kBc, S);
        __syncthreads();
        float s[kBc / 16][kE];
#pragma unroll
        for (int n = 0; n < kBc / 16; ++n) {
#pragma unroll
            for (int i = 0; i < kE; ++i) s[n][i] = 0;
        }
        MmaABt<M, kD, kBc / 16>(s, sQ + warp * 16 * kLd, kLd, sK, kLd, lane);
        const bool edge = k0 + kBc > S || (causal && k0 + kBc - 1 > wrow);
        float mx[kE];
#pragma unroll
        for (int i = 0; i < kE; ++i) mx[i] = -INFINITY;
#pragma unroll
        for (int n = 0; n < kBc / 16; ++n) {
#pragma unroll
            for (int i = 0; i < kE; ++i) {
                float x = s[n][i] * sl2;
                if (edge) {
                    const int key = k0 + n * 16 + M::CCol(lane, i), row = wrow + M::CRow(lane, i);
                    if (key >= S || (causal && key > row)) x = -INFINITY;
                }
                s[n][i] = x;
                mx[i] = fmaxf(mx[i], x);
            }
        }
        RowReduce<M>(mx, MaxF());
        float base[kE];
#pragma unroll
        for (int i = 0; i < kE; ++i) {
            const float mn = fmaxf(m[i], mx[i]);
            base[i] = mn == -INFINITY ? 0.f : mn;
            const float alpha = exp2f(m[i] - base[i]);
            m[i] = mn;
            l[i] *= alpha;
#pragma unroll
            for (int n = 0; n < kD / 16; ++n) o[n][i] *= alpha;
        }
#pragma unroll
        for (int n = 0; n < kBc / 16; ++n) {
#pragma unroll
            for (int i = 0; i < kE; ++i) {
                s[n][i] = exp2f(s[n][i] - base[i]);
                l[i] += s[n][i];  // this lane's part; rows reduced at the end
            }
        }
        MmaPB<M, kDirect, kBc / 16, kD / 16>(o, s, sV, kLd, stage, lane);
    }
    RowReduce<M>(l, SumF());
    float inv[kE];
#pragma unroll
    for (int i = 0; i < kE; ++i) inv[i] = l[i] > 0 ? 1.f / l[i] : 0.f;
    StoreC<M, kD / 16, kD>(out + bh * Tn * kD, o, inv, wrow, Tn, lane);
#pragma unroll
    for (int i = 0; i < kE; ++i) {
        const int row = wrow + M::CRow(lane, i);
        if (M::CCol(lane, i) == 0 && row < Tn) lse[bh * Tn + row] = l[i] > 0 ? m[i] * kLn2 + logf(l[i]) : -INFINITY;
    }
}

// Grid (b * Hq, query tiles, last first).
template <class M, bool kStage, typename T, int kD>
__global__ void __launch_bounds__(kBlockThreads)
    DqTc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
         const float* __restrict__ lse, const float* __restrict__ dsum, T* __restrict__ dq, int Hq, int g, int Tn,
         int S, bool causal, float sl2, float scale) {
    using Cf = TcCfg<kD>;
    constexpr int kE = M::kElems, kBr = Cf::kRows, kBc = Cf::kDqKeys, kLd = Cf::kLd;
    constexpr bool kDirect = Direct<M, kStage>();
    __shared__ __align__(16) T sQ[kBr * kLd];
    __shared__ __align__(16) T sO[kBr * kLd];
    __shared__ __align__(16) T sK[kBc * kLd];
    __shared__ __align__(16) T sV[kBc * kLd];
    __shared__ __align__(16) T sStage[kDirect ? 1 : kBlockThreads / 32 * 16 * kStageLd];
    const int64_t bh = blockIdx.x, kvh = KvHead(bh, Hq, g);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wrow = q0 + warp * 16;
    const T* kb = k + kvh * S * kD;
    const T* vb = v + kvh * S * kD;
    T* stage = sStage + (kDirect ? 0 : warp * 16 * kStageLd);
    LoadTileH<kD, kLd>(sQ, q + bh * Tn * kD, q0, kBr, Tn);
    LoadTileH<kD, kLd>(sO, dout + bh * Tn * kD, q0, kBr, Tn);
    float acc[kD / 16][kE], lse2[kE], drow[kE];
#pragma unroll
    for (int i = 0; i < kE; ++i) {
        const int row = wrow + M::CRow(lane, i);
        lse2[i] = row < Tn ? lse[bh * Tn + row] * kLog2e : 0.f;
        drow[i] = row < Tn ? dsum[bh * Tn + row] : 0.f;
#pragma unroll
        for (int n = 0; n < kD / 16; ++n) acc[n][i] = 0;
    }
    const int kend = causal ? min(S, q0 + kBr) : S;
    for (int k0 = 0; k0 < kend; k0 += kBc) {
        __syncthreads();
        LoadTileH<kD, kLd>(sK, kb, k0, kBc, S);
        LoadTileH<kD, kLd>(sV, vb, k0, kBc, S);
        __syncthreads();
        float s[kBc / 16][kE], dp[kBc / 16][kE];
#pragma unroll
        for (int n = 0; n < kBc / 16; ++n) {
#pragma unroll
            for (int i = 0; i < kE; ++i) s[n][i] = 0, dp[n][i] = 0;
        }
        MmaABt<M, kD, kBc / 16>(s, sQ + warp * 16 * kLd, kLd, sK, kLd, lane);
        MmaABt<M, kD, kBc / 16>(dp, sO + warp * 16 * kLd, kLd, sV, kLd, lane);
        const bool edge = k0 + kBc > S || (causal && k0 + kBc - 1 > wrow);
#pragma unroll
        for (int n = 0; n < kBc / 16; ++n) {
#pragma unroll
            for (int i = 0; i < kE; ++i) {
                float p = exp2f(s[n][i] * sl2 - lse2[i]);
                if (edge) {
                    const int key = k0 + n * 16 + M::CCol(lane, i), row = wrow + M::CRow(lane, i);
                    if (key >= S || (causal && key > row)) p = 0;
                }
                s[n][i] = p * (dp[n][i] - drow[i]);  // dS
            }
        }
        MmaPB<M, kDirect, kBc / 16, kD / 16>(acc, s, sK, kLd, stage, lane);
    }
    float mul[kE];
#pragma unroll
    for (int i = 0; i < kE; ++i) mul[i] = scale;
    StoreC<M, kD / 16, kD>(dq + bh * Tn * kD, acc, mul, wrow, Tn, lane);
}

// Grid (b * Hkv, key tiles); a warp owns 16 keys.
template <class M, bool kStage, typename T, int kD>
__global__ void __launch_bounds__(kBlockThreads)
    DkvTc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
          const float* __restrict__ lse, const float* __restrict__ dsum, T* __restrict__ dk, T* __restrict__ dv,
          int Hkv, int g, int Tn, int S, bool causal, float sl2, float scale) {
    using Cf = TcCfg<kD>;
    constexpr int kE = M::kElems, kBk = Cf::kRows, kBq = Cf::kDkvQueries, kLd = Cf::kLd;
    constexpr bool kDirect = Direct<M, kStage>();
    __shared__ __align__(16) T sK[kBk * kLd];
    __shared__ __align__(16) T sV[kBk * kLd];
    __shared__ __align__(16) T sQ[kBq * kLd];
    __shared__ __align__(16) T sO[kBq * kLd];
    __shared__ float sL[kBq], sD[kBq];
    __shared__ __align__(16) T sStage[kDirect ? 1 : kBlockThreads / 32 * 16 * kStageLd];
    const int64_t bkv = blockIdx.x;
    const int k0 = blockIdx.y * kBk;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wkey = k0 + warp * 16;
    T* stage = sStage + (kDirect ? 0 : warp * 16 * kStageLd);
    LoadTileH<kD, kLd>(sK, k + bkv * S * kD, k0, kBk, S);
    LoadTileH<kD, kLd>(sV, v + bkv * S * kD, k0, kBk, S);
    float dka[kD / 16][kE], dva[kD / 16][kE];
#pragma unroll
    for (int n = 0; n < kD / 16; ++n) {
#pragma unroll
        for (int i = 0; i < kE; ++i) dka[n][i] = 0, dva[n][i] = 0;
    }
    const int qstart = causal ? k0 / kBq * kBq : 0;
    for (int hh = 0; hh < g; ++hh) {
        const int64_t bh = bkv / Hkv * (static_cast<int64_t>(Hkv) * g) + bkv % Hkv * g + hh;
        const T* qb = q + bh * Tn * kD;
        const T* ob = dout + bh * Tn * kD;
        for (int q0 = qstart; q0 < Tn; q0 += kBq) {
            __syncthreads();
            LoadTileH<kD, kLd>(sQ, qb, q0, kBq, Tn);
            LoadTileH<kD, kLd>(sO, ob, q0, kBq, Tn);
            for (int r = threadIdx.x; r < kBq; r += kBlockThreads) {
                const int t = q0 + r;
                sL[r] = t < Tn ? lse[bh * Tn + t] * kLog2e : INFINITY;  // no query: p = 0
                sD[r] = t < Tn ? dsum[bh * Tn + t] : 0.f;
            }
            __syncthreads();
            float s[kBq / 16][kE], dp[kBq / 16][kE];
#pragma unroll
            for (int n = 0; n < kBq / 16; ++n) {
#pragma unroll
                for (int i = 0; i < kE; ++i) s[n][i] = 0, dp[n][i] = 0;
            }
            // S^T and dP^T: rows are this warp's keys, columns the tile's queries.
            MmaABt<M, kD, kBq / 16>(s, sK + warp * 16 * kLd, kLd, sQ, kLd, lane);
            MmaABt<M, kD, kBq / 16>(dp, sV + warp * 16 * kLd, kLd, sO, kLd, lane);
            const bool edge = causal && q0 < wkey + 15;
#pragma unroll
            for (int n = 0; n < kBq / 16; ++n) {
#pragma unroll
                for (int i = 0; i < kE; ++i) {
                    const int c = n * 16 + M::CCol(lane, i);
                    float p = exp2f(s[n][i] * sl2 - sL[c]);
                    if (edge && wkey + M::CRow(lane, i) > q0 + c) p = 0;
                    s[n][i] = p;
                    dp[n][i] = p * (dp[n][i] - sD[c]);  // dS^T
                }
            }
            MmaPB<M, kDirect, kBq / 16, kD / 16>(dva, s, sO, kLd, stage, lane);
            MmaPB<M, kDirect, kBq / 16, kD / 16>(dka, dp, sQ, kLd, stage, lane);
        }
    }
    float one[kE], mul[kE];
#pragma unroll
    for (int i = 0; i < kE; ++i) one[i] = 1.f, mul[i] = scale;
    StoreC<M, kD / 16, kD>(dk + bkv * S * kD, dka, mul, wkey, S, lane);
    StoreC<M, kD / 16, kD>(dv + bkv * S * kD, dva, one, wkey, S, lane);
}

// ============================== host side ==============================

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, FlashPolicy P>
constexpr bool Supported() {
    if (!std::is_same<T, float>::value && !std::is_same<T, bf16_t>::value && !std::is_same<T, fp16_t>::value) {
        return false;
    }
    return P == FlashPolicy::kSimt || (kHasTileMma && !std::is_same<T, float>::value);
}

// Shapes the kernels take: int row indices within a head, grid limits.
inline bool ShapeOk(int64_t B, int64_t Hq, int64_t Hkv, int64_t T_len, int64_t S, int64_t D, bool causal) {
    if (D != 32 && D != 64 && D != 128) return false;
    if (B < 0 || Hq < 0 || Hkv <= 0 || Hq % Hkv != 0 || T_len < 0 || S < 0) return false;
    if (causal && T_len != S) return false;
    const int64_t kMaxInt = (int64_t{1} << 31) - 1;
    if (T_len > kMaxInt - 256 || S > kMaxInt - 256 || B * Hq > kMaxInt) return false;
    return (T_len + 15) / 16 <= 65535 && (S + 15) / 16 <= 65535;
}

inline unsigned Tiles(int64_t n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

template <typename T, FlashPolicy P, int kD>
void ForwardD(const T* q, const T* k, const T* v, T* out, float* lse, int64_t B, int64_t Hq, int64_t Hkv, int64_t T_len,
              int64_t S, bool causal, float scale, NativeStream_t stream, const char* op) {
    const int g = static_cast<int>(Hq / Hkv), Tn = static_cast<int>(T_len), Sn = static_cast<int>(S);
    const float sl2 = scale * kLog2e;
    if constexpr (P == FlashPolicy::kSimt) {
        const dim3 grid(static_cast<unsigned>(B * Hq), Tiles(T_len, SimtCfg<kD>::kRows));
        FwdSimt<T, kD>
            <<<grid, kBlockThreads, 0, stream>>>(q, k, v, out, lse, static_cast<int>(Hq), g, Tn, Sn, causal, sl2);
    } else {
        constexpr bool kStage = P == FlashPolicy::kTileMmaStaged;
        const dim3 grid(static_cast<unsigned>(B * Hq), Tiles(T_len, TcCfg<kD>::kRows));
        FwdTc<TileMma, kStage, T, kD>
            <<<grid, kBlockThreads, 0, stream>>>(q, k, v, out, lse, static_cast<int>(Hq), g, Tn, Sn, causal, sl2);
    }
    GPU_CHECK_LAUNCH(op);
}

template <typename T, FlashPolicy P, int kD>
void BackwardD(const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse, T* dq, T* dk, T* dv,
               float* dsum, int64_t B, int64_t Hq, int64_t Hkv, int64_t T_len, int64_t S, bool causal, float scale,
               NativeStream_t stream, const char* op) {
    const int g = static_cast<int>(Hq / Hkv), Tn = static_cast<int>(T_len), Sn = static_cast<int>(S);
    const float sl2 = scale * kLog2e;
    const int64_t rows = B * Hq * T_len;
    if (rows > 0) {
        RowDotKernel<T, kD><<<Blocks(rows, kBlockThreads / kGroup), kBlockThreads, 0, stream>>>(dout, out, dsum, rows);
        GPU_CHECK_LAUNCH(op);
    }
    constexpr bool kSimt = P == FlashPolicy::kSimt;
    constexpr bool kStage = P == FlashPolicy::kTileMmaStaged;
    if (rows > 0) {
        if constexpr (kSimt) {
            const dim3 grid(static_cast<unsigned>(B * Hq), Tiles(T_len, SimtCfg<kD>::kRows));
            DqSimt<T, kD><<<grid, kBlockThreads, 0, stream>>>(q, k, v, dout, lse, dsum, dq, static_cast<int>(Hq), g, Tn,
                                                              Sn, causal, sl2, scale);
        } else {
            const dim3 grid(static_cast<unsigned>(B * Hq), Tiles(T_len, TcCfg<kD>::kRows));
            DqTc<TileMma, kStage, T, kD><<<grid, kBlockThreads, 0, stream>>>(
                q, k, v, dout, lse, dsum, dq, static_cast<int>(Hq), g, Tn, Sn, causal, sl2, scale);
        }
        GPU_CHECK_LAUNCH(op);
    }
    if (B * Hkv * S > 0) {
        if constexpr (kSimt) {
            const dim3 grid(static_cast<unsigned>(B * Hkv), Tiles(S, SimtCfg<kD>::kRows));
            DkvSimt<T, kD><<<grid, kBlockThreads, 0, stream>>>(q, k, v, dout, lse, dsum, dk, dv, static_cast<int>(Hkv),
                                                               g, Tn, Sn, causal, sl2, scale);
        } else {
            const dim3 grid(static_cast<unsigned>(B * Hkv), Tiles(S, TcCfg<kD>::kRows));
            DkvTc<TileMma, kStage, T, kD><<<grid, kBlockThreads, 0, stream>>>(
                q, k, v, dout, lse, dsum, dk, dv, static_cast<int>(Hkv), g, Tn, Sn, causal, sl2, scale);
        }
        GPU_CHECK_LAUNCH(op);
    }
}

}  // namespace flash

// out [B, Hq, T, D] and lse [B, Hq, T] of sdpa; false (nothing launched) where the kernels do not apply.
template <typename T, FlashPolicy P = DefaultFlashPolicy<T>()>
bool LaunchFlashForward(const T* q, const T* k, const T* v, T* out, float* lse, int64_t B, int64_t Hq, int64_t Hkv,
                        int64_t T_len, int64_t S, int64_t D, bool causal, double scale, NativeStream_t stream,
                        const char* op = "sdpa") {
    if constexpr (!flash::Supported<T, P>()) {
        return false;
    } else {
        if (!flash::ShapeOk(B, Hq, Hkv, T_len, S, D, causal)) return false;
        for (const void* p : {static_cast<const void*>(q), static_cast<const void*>(k), static_cast<const void*>(v),
                              static_cast<const void*>(out), static_cast<const void*>(lse)}) {
            if (!flash::Aligned16(p)) return false;
        }
        if (B * Hq * T_len == 0) return true;
        const float sc = static_cast<float>(scale);
        if (D == 32) flash::ForwardD<T, P, 32>(q, k, v, out, lse, B, Hq, Hkv, T_len, S, causal, sc, stream, op);
        if (D == 64) flash::ForwardD<T, P, 64>(q, k, v, out, lse, B, Hq, Hkv, T_len, S, causal, sc, stream, op);
        if (D == 128) flash::ForwardD<T, P, 128>(q, k, v, out, lse, B, Hq, Hkv, T_len, S, causal, sc, stream, op);
        return true;
    }
}

// dq, dk, dv of sdpa_backward from dO, q, k, v, out, lse; d_scratch is float32 [B * Hq * T] (D = rowsum(dO out)).
template <typename T, FlashPolicy P = DefaultFlashPolicy<T>()>
bool LaunchFlashBackward(const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse, T* dq,
                         T* dk, T* dv, float* d_scratch, int64_t B, int64_t Hq, int64_t Hkv, int64_t T_len, int64_t S,
                         int64_t D, bool causal, double scale, NativeStream_t stream,
                         const char* op = "sdpa_backward") {
    if constexpr (!flash::Supported<T, P>()) {
        return false;
    } else {
        if (!flash::ShapeOk(B, Hq, Hkv, T_len, S, D, causal)) return false;
        for (const void* p : {static_cast<const void*>(dout), static_cast<const void*>(q), static_cast<const void*>(k),
                              static_cast<const void*>(v), static_cast<const void*>(out), static_cast<const void*>(lse),
                              static_cast<const void*>(dq), static_cast<const void*>(dk), static_cast<const void*>(dv),
                              static_cast<const void*>(d_scratch)}) {
            if (!flash::Aligned16(p)) return false;
        }
        const float sc = static_cast<float>(scale);
        if (D == 32) {
            flash::BackwardD<T, P, 32>(dout, q, k, v, out, lse, dq, dk, dv, d_scratch, B, Hq, Hkv, T_len, S, causal, sc,
                                       stream, op);
        }
        if (D == 64) {
            flash::BackwardD<T, P, 64>(dout, q, k, v, out, lse, dq, dk, dv, d_scratch, B, Hq, Hkv, T_len, S, causal, sc,
                                       stream, op);
        }
        if (D == 128) {
            flash::BackwardD<T, P, 128>(dout, q, k, v, out, lse, dq, dk, dv, d_scratch, B, Hq, Hkv, T_len, S, causal,
                                        sc, stream, op);
        }
        return true;
    }
}

}  // namespace infinitrain::gpu
