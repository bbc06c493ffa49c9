// FP8, portable: fp8_quantize (x * scale saturated and rounded to float8, and max |x|), fp8_amax_push_ (delayed
// scaling's history and scale update, one block), a byte transpose, and a plain fp8_matmul kernel that a vendor FP8
// GEMM falls back to (see fp8.h). Conversions: infinitrain/fp8.h, the
// same integer code as the CPU's, so both round alike.
//   fp8_quantize: a grid-stride pass, 8 elements a thread (16- or 32-byte loads, one 8-byte store) where sizes and
//     alignment allow, else one; each block's max |x| (NaN wins) enters the 0-d output with an atomic max on the
//     float's bits (non-negative floats order as their bits; a NaN's bits are above infinity's). Codes through the
//     vendor's hardware conversion where it has one (INFINITRAIN_GPU_FP8_CONVERT), else the integer code: the same
//     codes (saturated, round to nearest even; NaN keeps its sign, set here).
//   fp8_quantize_delayed_: 64 x 64 tiles of x [R, C], blocks striding over them, 8 elements of a row a thread
//     (vector loads, both of a thread's rows in flight, 8-byte stores where C % 8 == 0); the tile's codes pass
//     through shared memory to out_t (4 rows of a column a thread); column sums from the registers (a warp's
//     rows by shuffles, then its 8 warps in order; a second kernel adds the tiles in order).
//     Each block writes its max |x|; a one-block kernel reduces them and moves the history as fp8_amax_push_
//     does. No atomics: every sum and max comes out the same on every run.
//   transpose: 64 x 64 tiles through shared memory, 4 bytes a thread (32 x 32 and 1 byte where sizes are odd).
//   matmul: out[i, j] = sum_k a(i, k) b(k, j) in float32, k in order, then * a_inv * b_inv + bias, rounded once.
#include <algorithm>

#include "backends/gpu/context.h"
#include "backends/gpu/copy.cuh"
#include "backends/gpu/fp8.h"
#include "infinitrain/fp8.h"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

template <DataType S>
__device__ __forceinline__ float LoadFloat(Storage<S> v) {
    if constexpr (S == DataType::kFloat64) {
        return static_cast<float>(v);
    } else {
        return ToAcc(v);
    }
}

// The dtypes the quantize kernels read.
template <DataType S>
constexpr bool kFp8Source =
    S == DataType::kFloat32 || S == DataType::kFloat64 || S == DataType::kBFloat16 || S == DataType::kFloat16;

// Whether 8 elements a thread fit: 16-byte loads of x, 8-byte stores of out, runs of 8 (n: the row length, or the
// element count of a flat pass).
template <DataType S>
bool EightWide(const Storage<S>* x, const uint8_t* out, int64_t n) {
    return S != DataType::kFloat64 && n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(out) % 8 == 0;
}

// Two quantized codes (lo in bits 0-7, hi in 8-15): QuantizeFp8's, by the vendor's conversion where it has one.
template <bool kE5M2>
__device__ __forceinline__ uint32_t QuantizePair(float lo, float hi, float s) {
#if defined(INFINITRAIN_GPU_FP8_CONVERT)
    lo *= s;
    hi *= s;
    uint32_t c = Fp8x2Saturate(lo, hi, kE5M2) & 0xffffu;
    if (isnan(lo)) c = (c & 0xff00u) | (signbit(lo) ? 0xffu : 0x7fu);
    if (isnan(hi)) c = (c & 0x00ffu) | (signbit(hi) ? 0xff00u : 0x7f00u);
    return c;
#else
    return QuantizeFp8<kE5M2>(lo, s) | (static_cast<uint32_t>(QuantizeFp8<kE5M2>(hi, s)) << 8);
#endif
}

// 8 elements a thread: x 16-byte aligned, out 8-byte aligned, n8 = n / 8.
template <DataType S, bool kE5M2>
__global__ void QuantizeVec8Kernel(const Storage<S>* __restrict__ x, uint2* __restrict__ out, int64_t n8,
                                   const float* __restrict__ scale, unsigned int* __restrict__ amax_bits) {
    constexpr int kVecs = 8 * sizeof(Storage<S>) / sizeof(uint4);
    const float s = *scale;
    float m = 0.0f;
    GPU_KERNEL_LOOP(i, n8) {
        alignas(16) Storage<S> v[8];
        const uint4* src = reinterpret_cast<const uint4*>(x + i * 8);
#pragma unroll
        for (int q = 0; q < kVecs; ++q) reinterpret_cast<uint4*>(v)[q] = src[q];
        float f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            f[j] = ToAcc(v[j]);
            m = NanMaxOp{}(m, fabsf(f[j]));
        }
        const uint32_t lo = QuantizePair<kE5M2>(f[0], f[1], s) | (QuantizePair<kE5M2>(f[2], f[3], s) << 16);
        const uint32_t hi = QuantizePair<kE5M2>(f[4], f[5], s) | (QuantizePair<kE5M2>(f[6], f[7], s) << 16);
        out[i] = make_uint2(lo, hi);
    }
    m = BlockReduce(m, NanMaxOp{}, 0.0f);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(fabsf(m)));
}

template <DataType S, bool kE5M2>
__global__ void QuantizeKernel(const Storage<S>* __restrict__ x, uint8_t* __restrict__ out, int64_t n,
                               const float* __restrict__ scale, unsigned int* __restrict__ amax_bits) {
    const float s = *scale;
    float m = 0.0f;
    GPU_KERNEL_LOOP(i, n) {
        const float v = LoadFloat<S>(x[i]);
        out[i] = QuantizeFp8<kE5M2>(v, s);
        m = NanMaxOp{}(m, fabsf(v));
    }
    m = BlockReduce(m, NanMaxOp{}, 0.0f);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(fabsf(m)));
}

void Fp8Quantize(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &scale = ctx.in[1], &out = ctx.out[0], &amax = ctx.out[1];
    const NativeStream_t s = NativeStream(ctx);
    MemsetAsync(amax.data(), 0, sizeof(float), s);
    const int64_t n = x.numel();
    if (n == 0) return;
    const bool e5m2 = out.dtype() == DataType::kFloat8E5M2;
    DispatchAll(x.dtype(), [&](auto sc) {
        constexpr DataType S = decltype(sc)::value;
        if constexpr (kFp8Source<S>) {
            auto* xp = static_cast<const Storage<S>*>(x.data());
            auto* op = static_cast<uint8_t*>(out.data());
            auto* sp = static_cast<const float*>(scale.data());
            auto* ap = static_cast<unsigned int*>(amax.data());
            const bool vec = EightWide<S>(xp, op, n);
            if constexpr (S != DataType::kFloat64) {
                if (vec) {
                    auto* o8 = reinterpret_cast<uint2*>(op);
                    if (e5m2) {
                        QuantizeVec8Kernel<S, true><<<Blocks(n / 8), kThreads, 0, s>>>(xp, o8, n / 8, sp, ap);
                    } else {
                        QuantizeVec8Kernel<S, false><<<Blocks(n / 8), kThreads, 0, s>>>(xp, o8, n / 8, sp, ap);
                    }
                }
            }
            if (!vec && e5m2) {
                QuantizeKernel<S, true><<<Blocks(n), kThreads, 0, s>>>(xp, op, n, sp, ap);
            } else if (!vec) {
                QuantizeKernel<S, false><<<Blocks(n), kThreads, 0, s>>>(xp, op, n, sp, ap);
            }
            GPU_CHECK_LAUNCH("fp8_quantize");
        } else {
            OpError("fp8_quantize", std::string("no ") + DataTypeName(S) + " variant");
        }
    });
}

constexpr int kQTile = 64;
constexpr int64_t kDelayedBlocks = 1024;  // several tiles a block: the prefetch has work to hide behind

struct DelayedArgs {
    int64_t rows, cols, col_tiles, row_tiles;
    const float* scale;  // scale[row]
    float* scale_inv;    // 1 / scale[row], written by block 0
    uint8_t* out_t;      // [C, R] or null
    float* partial;      // column sums of each tile [row_tiles, C], or null
    float* amax;         // each block's max |x| [blocks], or null (no update)
};

// Loads 8 consecutive elements of x at (r, c), zeros outside the tensor; raw, so that a prefetch does not wait.
template <DataType S>
__device__ __forceinline__ void Load8(const Storage<S>* __restrict__ x, int64_t r, int64_t c, bool in, bool vec,
                                      int64_t cols, Storage<S>* v) {
    if (vec && in) {
        constexpr int kVecs = 8 * sizeof(Storage<S>) / sizeof(uint4);
        const uint4* src = reinterpret_cast<const uint4*>(x + r * cols + c);
#pragma unroll
        for (int q = 0; q < kVecs; ++q) reinterpret_cast<uint4*>(v)[q] = src[q];
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = in && c + j < cols ? x[r * cols + c + j] : Storage<S>{};
    }
}

// Blocks stride over the tiles.
template <DataType S, bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    QuantizeDelayedKernel(const Storage<S>* __restrict__ x, uint8_t* __restrict__ out, DelayedArgs a, bool vec) {
    constexpr int kPasses = kQTile * 8 / kThreads;  // rows a thread loads per tile
    __shared__ uint8_t codes[kQTile][kQTile + 4];
    __shared__ float warp_sums[kThreads / 32][kQTile];  // each warp's column sums of its 8 rows of the tile
    const float s = *a.scale;
    const int64_t tiles = a.row_tiles * a.col_tiles;
    const int lane = threadIdx.x % 8, sub = threadIdx.x / 8;
    float m = 0.0f;
    // The next tile's rows are loaded while this one is quantized and written (loads in flight all along).
    alignas(16) Storage<S> next[kPasses][8];
    auto load = [&](int64_t t) {
        const int64_t r0 = t / a.col_tiles * kQTile, c = t % a.col_tiles * kQTile + 8 * lane;
#pragma unroll
        for (int p = 0; p < kPasses; ++p) {
            const int64_t r = r0 + sub + p * (kThreads / 8);
            Load8<S>(x, r, c, r < a.rows && c < a.cols, vec, a.cols, next[p]);
        }
    };
    if (blockIdx.x < tiles) load(blockIdx.x);
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int64_t ty = t / a.col_tiles, r0 = ty * kQTile, c0 = (t % a.col_tiles) * kQTile;
        const int64_t c = c0 + 8 * lane;
        float f[kPasses][8];
#pragma unroll
        for (int p = 0; p < kPasses; ++p) {
#pragma unroll
            for (int j = 0; j < 8; ++j) f[p][j] = LoadFloat<S>(next[p][j]);
        }
        if (t + gridDim.x < tiles) load(t + gridDim.x);
        __syncthreads();  // the previous tile's readers of codes and warp_sums are done
#pragma unroll
        for (int p = 0; p < kPasses; ++p) {
            const int i = sub + p * (kThreads / 8);
            const int64_t r = r0 + i;
#pragma unroll
            for (int j = 0; j < 8; ++j) m = NanMaxOp{}(m, fabsf(f[p][j]));
            const uint32_t lo =
                QuantizePair<kE5M2>(f[p][0], f[p][1], s) | (QuantizePair<kE5M2>(f[p][2], f[p][3], s) << 16);
            const uint32_t hi =
                QuantizePair<kE5M2>(f[p][4], f[p][5], s) | (QuantizePair<kE5M2>(f[p][6], f[p][7], s) << 16);
            if (r < a.rows && c < a.cols) {
                if (vec) {
                    *reinterpret_cast<uint2*>(out + r * a.cols + c) = make_uint2(lo, hi);
                } else {
                    for (int j = 0; j < 8 && c + j < a.cols; ++j) {
                        out[r * a.cols + c + j] = (j < 4 ? lo : hi) >> (8 * (j % 4));
                    }
                }
            }
            if (a.out_t) {
                *reinterpret_cast<uint32_t*>(&codes[i][8 * lane]) = lo;  // rows 68 bytes apart: 4-byte aligned
                *reinterpret_cast<uint32_t*>(&codes[i][8 * lane + 4]) = hi;
            }
        }
        if (a.partial) {
            // Column sums of the warp's 8 rows: its own 2 rows, then across the 4 row groups of the warp (xor
            // shuffles: every lane gets the same sum in the same order).
            float cs[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                cs[j] = f[0][j];
#pragma unroll
                for (int p = 1; p < kPasses; ++p) cs[j] += f[p][j];
                cs[j] += __shfl_xor_sync(kFullLaneMask, cs[j], 8, kGroup);
                cs[j] += __shfl_xor_sync(kFullLaneMask, cs[j], 16, kGroup);
            }
            if (threadIdx.x % 32 < 8) {
#pragma unroll
                for (int j = 0; j < 8; ++j) warp_sums[threadIdx.x / 32][8 * lane + j] = cs[j];
            }
        }
        if (!a.out_t && !a.partial) continue;
        __syncthreads();
        if (a.out_t) {
            const bool words = a.rows % 4 == 0;
            for (int w = threadIdx.x; w < kQTile * kQTile / 4; w += kThreads) {
                const int i = w / (kQTile / 4), k = 4 * (w % (kQTile / 4));  // tile column i, tile rows k .. k + 3
                const int64_t col = c0 + i, r = r0 + k;
                if (col >= a.cols || r >= a.rows) continue;
                uint8_t* dst = a.out_t + col * a.rows + r;
                if (words) {
                    *reinterpret_cast<uint32_t*>(dst) = codes[k][i] | (codes[k + 1][i] << 8) | (codes[k + 2][i] << 16) |
                                                        (static_cast<uint32_t>(codes[k + 3][i]) << 24);
                } else {
                    for (int b = 0; b < 4 && r + b < a.rows; ++b) dst[b] = codes[k + b][i];
                }
            }
        }
        if (a.partial && threadIdx.x < kQTile && c0 + threadIdx.x < a.cols) {
            float acc = 0.0f;
#pragma unroll
            for (int w = 0; w < kThreads / 32; ++w) acc += warp_sums[w][threadIdx.x];
            a.partial[ty * a.cols + c0 + threadIdx.x] = acc;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *a.scale_inv = 1.0f / s;
    if (!a.amax) return;
    m = BlockReduce(m, NanMaxOp{}, 0.0f);
    if (threadIdx.x == 0) a.amax[blockIdx.x] = m;
}

// fp8_amax_push_ on one history row from the blocks' maxima (NaN wins): shift right, the amax in front, the row's
// max sets the scale where it is > 0 and finite.
__global__ void DelayedPushKernel(const float* __restrict__ part, int64_t n, float* __restrict__ hist, int64_t h,
                                  float* __restrict__ scale, float top) {
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = NanMaxOp{}(m, part[i]);
    m = BlockReduce(m, NanMaxOp{}, 0.0f);
    if (threadIdx.x != 0) return;
    float prev = m, mx = 0.0f;
    for (int64_t j = 0; j < h; ++j) {
        const float t = hist[j];
        hist[j] = prev;
        mx = NanMaxOp{}(mx, prev);
        prev = t;
    }
    if (mx > 0.0f && isfinite(mx)) *scale = top / mx;
}

// out[c] = sum over t of partial[t, c]: a block per 32 columns, warp w adding rows w, w + 8, ... (four loads in
// flight), then the 8 warps' sums in order.
constexpr int kSumWarps = 8;

__global__ void ColumnTilesKernel(const float* __restrict__ partial, float* __restrict__ out, int64_t tiles,
                                  int64_t cols) {
    __shared__ float part[kSumWarps][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
    float acc = 0.0f;
    if (c < cols) {
        int64_t t = warp;
        for (; t + 3 * kSumWarps < tiles; t += 4 * kSumWarps) {
            const float v0 = partial[t * cols + c], v1 = partial[(t + kSumWarps) * cols + c];
            const float v2 = partial[(t + 2 * kSumWarps) * cols + c], v3 = partial[(t + 3 * kSumWarps) * cols + c];
            acc += v0;
            acc += v1;
            acc += v2;
            acc += v3;
        }
        for (; t < tiles; t += kSumWarps) acc += partial[t * cols + c];
    }
    part[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && c < cols) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kSumWarps; ++w) sum += part[w][lane];
        out[c] = sum;
    }
}

void Fp8QuantizeDelayed(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &hist = ctx.in[1], &scale = ctx.in[2];
    const Tensor &out = ctx.out[0], &out_t = ctx.out[1], &sums = ctx.out[3];
    const int64_t row = ctx.i(0), rows = x.size(0), cols = x.size(1);
    const bool transpose = ctx.i(3) != 0, colsum = ctx.i(4) != 0, update = ctx.i(5) != 0;
    const bool e5m2 = out.dtype() == DataType::kFloat8E5M2;
    const NativeStream_t s = NativeStream(ctx);
    DelayedArgs a{};
    a.rows = rows;
    a.cols = cols;
    a.row_tiles = (rows + kQTile - 1) / kQTile;
    a.col_tiles = (cols + kQTile - 1) / kQTile;
    const int64_t tiles = a.row_tiles * a.col_tiles;
    float* sp = static_cast<float*>(scale.data());
    a.scale = sp + row;
    a.scale_inv = static_cast<float*>(ctx.out[2].data());
    a.out_t = transpose ? static_cast<uint8_t*>(out_t.data()) : nullptr;
    const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, kDelayedBlocks));
    Tensor partial, amax;
    if (colsum) {
        partial = Tensor::Empty({a.row_tiles, cols}, DataType::kFloat32, ctx.device);
        a.partial = static_cast<float*>(partial.data());
    }
    if (update) {
        amax = Tensor::Empty({static_cast<int64_t>(grid)}, DataType::kFloat32, ctx.device);
        a.amax = static_cast<float*>(amax.data());
    }
    DispatchAll(x.dtype(), [&](auto sc) {
        constexpr DataType S = decltype(sc)::value;
        if constexpr (kFp8Source<S>) {
            auto* xp = static_cast<const Storage<S>*>(x.data());
            auto* op = static_cast<uint8_t*>(out.data());
            const bool vec = EightWide<S>(xp, op, cols);
            if (e5m2) {
                QuantizeDelayedKernel<S, true><<<grid, kThreads, 0, s>>>(xp, op, a, vec);
            } else {
                QuantizeDelayedKernel<S, false><<<grid, kThreads, 0, s>>>(xp, op, a, vec);
            }
            GPU_CHECK_LAUNCH("fp8_quantize_delayed_");
        } else {
            OpError("fp8_quantize_delayed_", std::string("no ") + DataTypeName(S) + " variant");
        }
    });
    if (colsum && cols > 0) {
        const unsigned blocks = static_cast<unsigned>((cols + 31) / 32);
        ColumnTilesKernel<<<blocks, 32 * kSumWarps, 0, s>>>(a.partial, static_cast<float*>(sums.data()), a.row_tiles,
                                                            cols);
        GPU_CHECK_LAUNCH("fp8_quantize_delayed_ (column sums)");
    }
    if (update) {
        const double fmax = e5m2 ? Fp8Format<true>::kMax : Fp8Format<false>::kMax;
        const float top = static_cast<float>(fmax / ldexp(1.0, static_cast<int>(ctx.i(1))));
        const int64_t h = hist.size(1);
        DelayedPushKernel<<<1, kThreads, 0, s>>>(a.amax, grid, static_cast<float*>(hist.data()) + row * h, h, sp + row,
                                                 top);
        GPU_CHECK_LAUNCH("fp8_quantize_delayed_ (history)");
    }
}

constexpr int kTile = 32;

// Tiles of rows beyond the grid's y limit (65535) come round in the y loop.
__global__ void TransposeKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t rows,
                                int64_t cols) {
    __shared__ uint8_t tile[kTile][kTile + 1];
    const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile, row_tiles = (rows + kTile - 1) / kTile;
    for (int64_t ty = blockIdx.y; ty < row_tiles; ty += gridDim.y) {
        const int64_t r0 = ty * kTile;
        __syncthreads();  // the tile's last readers are done
        for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
            const int64_t r = r0 + i, c = c0 + threadIdx.x;
            if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
        }
        __syncthreads();
        for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
            const int64_t c = c0 + i, r = r0 + threadIdx.x;  // dst row c, column r
            if (c < cols && r < rows) dst[c * rows + r] = tile[threadIdx.x][i];
        }
    }
}

// 64 x 64 tiles, 4 bytes a thread each way (rows and cols multiples of 4, 4-byte aligned rows): a 16 x 16 block
// loads 16 rows of 64 bytes a pass, then writes 16 rows of the transposed tile a pass. The shared tile's rows are
// 68 bytes (17 words) apart, so a warp's column reads hit distinct banks.
constexpr int kWide = 64;

__global__ void TransposeWideKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t rows,
                                    int64_t cols) {
    __shared__ uint8_t tile[kWide][kWide + 4];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kWide, row_tiles = (rows + kWide - 1) / kWide;
    for (int64_t t = blockIdx.y; t < row_tiles; t += gridDim.y) {
        const int64_t r0 = t * kWide;
        __syncthreads();  // the tile's last readers are done
        for (int i = ty; i < kWide; i += 16) {
            const int64_t r = r0 + i, c = c0 + 4 * tx;
            if (r < rows && c < cols) {
                *reinterpret_cast<uint32_t*>(&tile[i][4 * tx]) = *reinterpret_cast<const uint32_t*>(src + r * cols + c);
            }
        }
        __syncthreads();
        for (int i = ty; i < kWide; i += 16) {
            const int64_t c = c0 + i, r = r0 + 4 * tx;  // dst row c, columns r .. r + 3
            if (c < cols && r < rows) {
                const uint32_t v = tile[4 * tx][i] | (tile[4 * tx + 1][i] << 8) | (tile[4 * tx + 2][i] << 16) |
                                   (static_cast<uint32_t>(tile[4 * tx + 3][i]) << 24);
                *reinterpret_cast<uint32_t*>(dst + c * rows + r) = v;
            }
        }
    }
}

__global__ void AddBiasKernel(float* __restrict__ out, const float* __restrict__ bias, int64_t m, int64_t n) {
    GPU_KERNEL_LOOP(i, m * n) { out[i] += bias[i % n]; }
}

template <bool kAE5M2, bool kBE5M2, typename T>
__global__ void MatmulKernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,
                             const float* __restrict__ a_inv, const float* __restrict__ b_inv,
                             const T* __restrict__ bias, T* __restrict__ out, int64_t m, int64_t n, int64_t k, bool ta,
                             bool tb) {
    const float scale = *a_inv * *b_inv;
    GPU_KERNEL_LOOP(idx, m * n) {
        const int64_t i = idx / n, j = idx % n;
        float acc = 0.0f;
        for (int64_t q = 0; q < k; ++q) {
            const float av = Fp8ToFloat<kAE5M2>(a[ta ? q * m + i : i * k + q]);
            const float bv = Fp8ToFloat<kBE5M2>(b[tb ? j * k + q : q * n + j]);
            acc += av * bv;
        }
        float v = acc * scale;
        if (bias) v += ToAcc(bias[j]);
        out[idx] = FromAcc<T>(v);
    }
}

// One block: the row shifts through shared memory, then its max (NaN wins) sets the scale.
__global__ void AmaxPushKernel(float* __restrict__ hist, float* __restrict__ scale, const float* __restrict__ amax,
                               int64_t row, int64_t h, float top) {
    extern __shared__ float buf[];
    float* r = hist + row * h;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) buf[j] = j == 0 ? *amax : r[j - 1];
    __syncthreads();
    float m = 0.0f;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
        r[j] = buf[j];
        m = NanMaxOp{}(m, buf[j]);
    }
    m = BlockReduce(m, NanMaxOp{}, 0.0f);
    if (threadIdx.x == 0 && m > 0.0f && isfinite(m)) scale[row] = top / m;
}

void Fp8AmaxPush(KernelContext& ctx) {
    const Tensor &hist = ctx.in[0], &scale = ctx.in[1];
    const int64_t h = hist.size(1);
    const float top = static_cast<float>(ctx.f(1) / ldexp(1.0, static_cast<int>(ctx.i(2))));
    const int threads = h >= 256 ? 256 : 32;
    AmaxPushKernel<<<1, threads, h * sizeof(float), NativeStream(ctx)>>>(
        static_cast<float*>(hist.data()), static_cast<float*>(scale.data()),
        static_cast<const float*>(ctx.in[2].data()), ctx.i(0), h, top);
    GPU_CHECK_LAUNCH("fp8_amax_push_");
}

}  // namespace

void TransposeBytes(const KernelContext& ctx, const Tensor& src, const Tensor& dst, int64_t rows, int64_t cols) {
    if (rows == 0 || cols == 0) return;
    const auto* sp = static_cast<const uint8_t*>(src.data());
    auto* dp = static_cast<uint8_t*>(dst.data());
    if (rows % 4 == 0 && cols % 4 == 0 && reinterpret_cast<uintptr_t>(sp) % 4 == 0 &&
        reinterpret_cast<uintptr_t>(dp) % 4 == 0) {
        const dim3 grid(static_cast<unsigned>((cols + kWide - 1) / kWide),
                        static_cast<unsigned>(std::min<int64_t>((rows + kWide - 1) / kWide, 65535)));
        TransposeWideKernel<<<grid, dim3(16, 16), 0, NativeStream(ctx)>>>(sp, dp, rows, cols);
        GPU_CHECK_LAUNCH("fp8_matmul (transpose)");
        return;
    }
    const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                    static_cast<unsigned>(std::min<int64_t>((rows + kTile - 1) / kTile, 65535)));
    TransposeKernel<<<grid, dim3(kTile, 8), 0, NativeStream(ctx)>>>(static_cast<const uint8_t*>(src.data()),
                                                                    static_cast<uint8_t*>(dst.data()), rows, cols);
    GPU_CHECK_LAUNCH("fp8_matmul (transpose)");
}

void AddBiasFloat32(const KernelContext& ctx, const Tensor& out, const Tensor& bias, int64_t m, int64_t n) {
    if (m * n == 0) return;
    AddBiasKernel<<<Blocks(m * n), kThreads, 0, NativeStream(ctx)>>>(static_cast<float*>(out.data()),
                                                                     static_cast<const float*>(bias.data()), m, n);
    GPU_CHECK_LAUNCH("fp8_matmul (bias)");
}

void PortableFp8Matmul(KernelContext& ctx) {
    const Tensor &a = ctx.in[0], &b = ctx.in[1], &out = ctx.out[0];
    const Tensor* bias = ctx.in.size() == 5 ? &ctx.in[4] : nullptr;
    const bool ta = ctx.i(0) != 0, tb = ctx.i(1) != 0;
    const int64_t m = out.size(0), n = out.size(1), k = ta ? a.size(0) : a.size(1);
    if (m * n == 0) return;
    const bool ae = a.dtype() == DataType::kFloat8E5M2, be = b.dtype() == DataType::kFloat8E5M2;
    const auto* ap = static_cast<const uint8_t*>(a.data());
    const auto* bp = static_cast<const uint8_t*>(b.data());
    const auto* ai = static_cast<const float*>(ctx.in[2].data());
    const auto* bi = static_cast<const float*>(ctx.in[3].data());
    DispatchFloat(out.dtype(), "fp8_matmul", [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_same_v<T, double>) {
            OpError("fp8_matmul", "no float64 output");
        } else {
            const T* biasp = bias ? static_cast<const T*>(bias->data()) : nullptr;
            T* op = static_cast<T*>(out.data());
            auto launch = [&](auto kernel) {
                kernel<<<Blocks(m * n), kThreads, 0, NativeStream(ctx)>>>(ap, bp, ai, bi, biasp, op, m, n, k, ta, tb);
            };
            if (ae) {
                launch(MatmulKernel<true, false, T>);  // e5m2 x e5m2 is refused by the op's shape rule
            } else if (be) {
                launch(MatmulKernel<false, true, T>);
            } else {
                launch(MatmulKernel<false, false, T>);
            }
            GPU_CHECK_LAUNCH("fp8_matmul");
        }
    });
}

REGISTER_PROVIDER_KERNEL(kProviderName, "fp8_quantize", Fp8Quantize);
REGISTER_PROVIDER_KERNEL(kProviderName, "fp8_amax_push_", Fp8AmaxPush);
REGISTER_PROVIDER_KERNEL(kProviderName, "fp8_quantize_delayed_", Fp8QuantizeDelayed);

}  // namespace infinitrain::gpu
