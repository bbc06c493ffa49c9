// Shared device helpers of the GPU kernels: storage/compute types and their
// conversions, dtype dispatch on the host, launch geometry, and 32-lane group
// and block reductions.
//
// Storage types are float, double, bf16_t and fp16_t (the vendor's 16-bit
// types); bf16/fp16 compute in float and round once to nearest even on store,
// float64 computes in double. Warp code works on logical 32-lane groups
// (shuffles of width 32, ids from threadIdx.x / 32 and % 32), so it runs
// unchanged on 32- and 64-lane hardware warps; block sizes are multiples of 32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "backends/gpu/vendor.h"
#include "infinitrain/op.h"

namespace infinitrain::gpu {

// ---- launch geometry ----------------------------------------------------------

constexpr int kThreads = 256;            // default block size
constexpr int kGroup = 32;               // logical group width of warp-level code
constexpr int64_t kMaxBlocks = 1 << 16;  // grid cap of grid-stride kernels

// Blocks for a grid-stride loop over n items (at least 1; callers skip n == 0).
inline unsigned Blocks(int64_t n, int threads = kThreads) {
    int64_t b = (n + threads - 1) / threads;
    return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(b, 1), kMaxBlocks));
}

// Grid-stride loop over [0, n) with 64-bit indices.
#define GPU_KERNEL_LOOP(i, n)                                                              \
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Grid-stride loop over rows, per_block rows a block (one per 32-lane group, or 1 for a block per row), in steps
// the whole block takes together: every thread runs the same iterations, so a group whose row `base + group` is
// past the end still joins its hardware warp's shuffles and block barriers (it must skip loads and stores).
#define GPU_BLOCK_ROWS_LOOP(base, rows, per_block)                                     \
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * (per_block); base < (rows); \
         base += static_cast<int64_t>(gridDim.x) * (per_block))

// Runs after every launch: turns a failed launch into an exception naming the op.
#define GPU_CHECK_LAUNCH(op) ::infinitrain::gpu::CheckLaunch(op)

// ---- storage and compute types -------------------------------------------------

template <typename T>
struct AccT {
    using type = float;
};
template <>
struct AccT<double> {
    using type = double;
};
template <typename T>
using Acc = typename AccT<T>::type;

__device__ __forceinline__ float ToAcc(float v) { return v; }
__device__ __forceinline__ double ToAcc(double v) { return v; }
__device__ __forceinline__ float ToAcc(bf16_t v) { return ToFloat(v); }
__device__ __forceinline__ float ToAcc(fp16_t v) { return ToFloat(v); }

// A product rounded on its own: never contracted into a multiply-add with a later subtraction, so d - mean(d)
// cancels exactly where it should (layernorm's dx of a one-element row is 0, not the product's rounding error).
__device__ __forceinline__ float MulRn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double MulRn(double a, double b) { return __dmul_rn(a, b); }

// Rounds a compute value to the storage type (once, to nearest even).
template <typename T>
__device__ __forceinline__ T FromAcc(Acc<T> v);
template <>
__device__ __forceinline__ float FromAcc<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ double FromAcc<double>(double v) {
    return v;
}
template <>
__device__ __forceinline__ bf16_t FromAcc<bf16_t>(float v) {
    return FloatToBF16(v);
}
template <>
__device__ __forceinline__ fp16_t FromAcc<fp16_t>(float v) {
    return FloatToFP16(v);
}

template <typename H>
__device__ __forceinline__ uint16_t BitsOf(H h) {
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
template <typename H>
__device__ __forceinline__ H FromBits(uint16_t u) {
    H h;
    memcpy(&h, &u, 2);
    return h;
}

// float16 from double, rounded once (through float would round twice); the CPU's DoubleToHalf.
__device__ inline fp16_t DoubleToFP16(double v) {
    if (isnan(v)) return FloatToFP16(static_cast<float>(v));
    uint16_t sign = signbit(v) ? 0x8000u : 0u;
    // At or past the overflow midpoint: infinity.
    if (fabs(v) >= 65520.0) return FromBits<fp16_t>(static_cast<uint16_t>(sign | 0x7c00u));
    uint16_t h = BitsOf(FloatToFP16(static_cast<float>(v)));
    double hv = ToFloat(FromBits<fp16_t>(h));
    if (hv == v) return FromBits<fp16_t>(h);
    // float(v) is within one half step of v: the answer is h or its neighbour toward v.
    uint16_t other = static_cast<uint16_t>(fabs(v) > fabs(hv) ? h + 1 : h - 1);
    double ov = ToFloat(FromBits<fp16_t>(other));
    double dh = fabs(v - hv), dother = fabs(v - ov);
    if (dother < dh || (dother == dh && (other & 1u) == 0)) return FromBits<fp16_t>(other);
    return FromBits<fp16_t>(h);
}

// bfloat16 from double, rounded once: float(v) rounds to nearest even, and when it lands exactly on a bf16
// halfway point the tie must follow where v was, so f moves one float ulp toward v (the CPU's StoreRounded).
__device__ inline bf16_t DoubleToBF16(double v) {
    float f = static_cast<float>(v);
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0xffffu) == 0x8000u && isfinite(f) && static_cast<double>(f) != v) {
        f = nextafterf(f, v > static_cast<double>(f) ? INFINITY : -INFINITY);
    }
    return FloatToBF16(f);
}

// A double rounded once to the storage type (random ops).
template <typename T>
__device__ __forceinline__ T FromDoubleOnce(double v);
template <>
__device__ __forceinline__ float FromDoubleOnce<float>(double v) {
    return static_cast<float>(v);
}
template <>
__device__ __forceinline__ double FromDoubleOnce<double>(double v) {
    return v;
}
template <>
__device__ __forceinline__ bf16_t FromDoubleOnce<bf16_t>(double v) {
    return DoubleToBF16(v);
}
template <>
__device__ __forceinline__ fp16_t FromDoubleOnce<fp16_t>(double v) {
    return DoubleToFP16(v);
}

// Raw element types of each size, for ops that move bytes (shape ops, where, embedding).
template <int kBytes>
struct RawT;
template <>
struct RawT<1> {
    using type = uint8_t;
};
template <>
struct RawT<2> {
    using type = uint16_t;
};
template <>
struct RawT<4> {
    using type = uint32_t;
};
template <>
struct RawT<8> {
    using type = uint64_t;
};

// ---- math in the compute type (float or double overloads, never the fast-math intrinsics) ----

__device__ __forceinline__ float Exp(float x) { return expf(x); }
__device__ __forceinline__ double Exp(double x) { return exp(x); }
__device__ __forceinline__ float Log(float x) { return logf(x); }
__device__ __forceinline__ double Log(double x) { return log(x); }
__device__ __forceinline__ float Sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double Sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float Sin(float x) { return sinf(x); }
__device__ __forceinline__ double Sin(double x) { return sin(x); }
__device__ __forceinline__ float Cos(float x) { return cosf(x); }
__device__ __forceinline__ double Cos(double x) { return cos(x); }
__device__ __forceinline__ float Tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double Tanh(double x) { return tanh(x); }
__device__ __forceinline__ float Pow(float x, float p) { return powf(x, p); }
__device__ __forceinline__ double Pow(double x, double p) { return pow(x, p); }
__device__ __forceinline__ float Erf(float x) { return erff(x); }
__device__ __forceinline__ double Erf(double x) { return erf(x); }
__device__ __forceinline__ float Erfc(float x) { return erfcf(x); }
__device__ __forceinline__ double Erfc(double x) { return erfc(x); }
__device__ __forceinline__ float Log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double Log1p(double x) { return log1p(x); }
__device__ __forceinline__ float Expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double Expm1(double x) { return expm1(x); }
__device__ __forceinline__ float Floor(float x) { return floorf(x); }
__device__ __forceinline__ double Floor(double x) { return floor(x); }
__device__ __forceinline__ float Ceil(float x) { return ceilf(x); }
__device__ __forceinline__ double Ceil(double x) { return ceil(x); }
__device__ __forceinline__ float Rint(float x) { return rintf(x); }
__device__ __forceinline__ double Rint(double x) { return rint(x); }
__device__ __forceinline__ float Trunc(float x) { return truncf(x); }
__device__ __forceinline__ double Trunc(double x) { return trunc(x); }
__device__ __forceinline__ float Fmod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double Fmod(double a, double b) { return fmod(a, b); }
__device__ __forceinline__ float Atan2(float a, float b) { return atan2f(a, b); }
__device__ __forceinline__ double Atan2(double a, double b) { return atan2(a, b); }
__device__ __forceinline__ float Fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double Fabs(double x) { return fabs(x); }
__device__ __forceinline__ float Fmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double Fmax(double a, double b) { return fmax(a, b); }

// ---- strided index maps -----------------------------------------------------------

constexpr int kMaxDims = 12;

// Dims of an output walked in row-major order and each operand's element stride per dim (0 where it repeats):
// broadcasting. I is the index type: launchers narrow a plan to 32-bit indices when every offset fits (64-bit
// integer division is several times slower on GPUs).
template <int N, typename I = int64_t>
struct Broadcast {
    int nd;
    I size[kMaxDims];
    I stride[N][kMaxDims];
};

// Element offsets of output index i in each operand.
template <int N, typename I>
__device__ __forceinline__ void BroadcastOffsets(const Broadcast<N, I>& b, I i, I (&off)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = b.nd - 1; d >= 0; --d) {
        const I q = i / b.size[d], r = i - q * b.size[d];
        i = q;
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += r * b.stride[k][d];
    }
}

// Whether plan `b` over n output elements indexes every operand within 32 bits.
template <int N>
inline bool Fits32(const Broadcast<N>& b, int64_t n) {
    if (n >= (int64_t{1} << 31)) return false;
    for (int k = 0; k < N; ++k) {
        int64_t last = 0;
        for (int d = 0; d < b.nd; ++d) last += (b.size[d] - 1) * b.stride[k][d];
        if (last >= (int64_t{1} << 31)) return false;
    }
    return true;
}

template <int N>
inline Broadcast<N, int32_t> Narrow32(const Broadcast<N>& b) {
    Broadcast<N, int32_t> r{};
    r.nd = b.nd;
    for (int d = 0; d < b.nd; ++d) {
        r.size[d] = static_cast<int32_t>(b.size[d]);
        for (int k = 0; k < N; ++k) r.stride[k][d] = static_cast<int32_t>(b.stride[k][d]);
    }
    return r;
}

// Grid-stride loop over [0, n) with indices of type I.
#define GPU_KERNEL_LOOP_T(I, i, n)                                             \
    for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
         i += static_cast<I>(gridDim.x) * blockDim.x)

// ---- host-side dtype dispatch -----------------------------------------------------

template <typename T>
struct Tag {
    using type = T;
};

// Calls f(Tag<T>{}) with T = float, double, bf16_t or fp16_t matching `t`; other dtypes raise.
template <typename F>
void DispatchFloat(DataType t, const char* op, F&& f) {
    switch (t) {
        case DataType::kFloat32:
            return f(Tag<float>{});
        case DataType::kFloat64:
            return f(Tag<double>{});
        case DataType::kBFloat16:
            return f(Tag<bf16_t>{});
        case DataType::kFloat16:
            return f(Tag<fp16_t>{});
        default:
            OpError(op, std::string("the ") + kProviderName + " kernel has no " + DataTypeName(t) + " variant");
    }
}

// Calls f(Tag<U>{}) with U the unsigned integer of the dtype's size (bytes moved as is).
template <typename F>
void DispatchBytes(DataType t, F&& f) {
    switch (DataTypeSize(t)) {
        case 1:
            return f(Tag<uint8_t>{});
        case 2:
            return f(Tag<uint16_t>{});
        case 4:
            return f(Tag<uint32_t>{});
        default:
            return f(Tag<uint64_t>{});
    }
}

// ---- reductions over 32-lane groups and blocks -------------------------------------

struct SumOp {
    template <typename V>
    __device__ __forceinline__ V operator()(V a, V b) const {
        return a + b;
    }
};

// max ignoring NaN (fmax), as the CPU's row maxima in softmax and cross-entropy.
struct FmaxOp {
    template <typename V>
    __device__ __forceinline__ V operator()(V a, V b) const {
        return Fmax(a, b);
    }
};

// max where NaN wins, as the CPU's amax.
struct NanMaxOp {
    template <typename V>
    __device__ __forceinline__ V operator()(V a, V b) const {
        return (b > a || isnan(b)) ? b : a;
    }
};

// Reduces v over the 32 lanes of this thread's group; every lane gets the result.
template <typename V, typename Op>
__device__ __forceinline__ V GroupReduce(V v, Op op) {
#pragma unroll
    for (int o = kGroup / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullLaneMask, v, o, kGroup));
    return v;
}

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result. All threads
// must call it. The leading barrier lets consecutive calls reuse the buffer.
template <typename V, typename Op>
__device__ V BlockReduce(V v, Op op, V identity) {
    __shared__ V buf[32];
    const int lane = threadIdx.x % kGroup, group = threadIdx.x / kGroup, groups = blockDim.x / kGroup;
    v = GroupReduce(v, op);
    __syncthreads();
    if (lane == 0) buf[group] = v;
    __syncthreads();
    if (group == 0) {
        v = GroupReduce(lane < groups ? buf[lane] : identity, op);
        if (lane == 0) buf[0] = v;
    }
    __syncthreads();
    return buf[0];
}

// Block size for one block per row of n elements: a power of two from 32 to 1024, about n / 4.
inline int RowBlockThreads(int64_t n) {
    int t = 32;
    while (t < 1024 && t * 4 < n) t *= 2;
    return t;
}

}  // namespace infinitrain::gpu
