// Elementwise kernels: unary math and the backward kernels of the nonlinear
// ones, scalar affine/pow/clamp, broadcasting binary arithmetic and
// comparisons, where, masked_fill, axpy_ and the SwiGLU pair.
//
// Layout: contiguous row-major tensors. Equal shapes run as flat maps
// (map.cuh, 16-byte accesses). Broadcasting follows NumPy: the host drops
// size-1 output dims and merges dims contiguous for every operand (as the CPU
// kernel does), then each output index is split into per-dim indices and
// every operand reads through its own strides, 0 on broadcast dims.
//
// Precision: bfloat16/float16 load to float, compute in float and round once
// on store; float64 computes in double. Functions are the CPU's: sigmoid
// splits at x = 0 so neither tail overflows, gelu_tanh is x * sigmoid(2u); the
// exact GELU is x Phi(x) with Phi from the vendor's erfc (a few ulp).
// maximum/minimum propagate NaN; relu and clamp pass NaN through. Comparisons
// write bool as uint8 0/1.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "backends/gpu/common.cuh"
#include "backends/gpu/map.cuh"

namespace infinitrain::gpu {

// ---- functions of the compute type -------------------------------------------------

template <typename V>
__device__ __forceinline__ V Sigmoid(V x) {
    if (x >= V(0)) return V(1) / (V(1) + Exp(-x));
    const V e = Exp(x);  // x < 0 (or NaN): no overflow
    return e / (V(1) + e);
}

template <typename V>
__device__ __forceinline__ V GeluInner(V x) {  // u = sqrt(2/pi) (x + 0.044715 x^3)
    return V(0.7978845608028654) * (x + V(0.044715) * x * x * x);
}

template <typename V>
__device__ __forceinline__ V GeluTanh(V x) {
    return x * Sigmoid(V(2) * GeluInner(x));
}

// d/dx gelu_tanh: s + 2 x s (1 - s) u' with s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <typename V>
__device__ __forceinline__ V GeluTanhGrad(V x) {
    const V s = Sigmoid(V(2) * GeluInner(x));
    const V t = s * (V(1) - s);
    if (t == V(0)) return s;  // saturated tails: skip 0 * inf when x^2 overflows
    return s + V(2) * x * t * V(0.7978845608028654) * (V(1) + V(3) * V(0.044715) * x * x);
}

struct NegF {
    template <typename V>
    __device__ V operator()(V x) const {
        return -x;
    }
};
struct ExpF {
    template <typename V>
    __device__ V operator()(V x) const {
        return Exp(x);
    }
};
struct LogF {
    template <typename V>
    __device__ V operator()(V x) const {
        return Log(x);
    }
};
struct SqrtF {
    template <typename V>
    __device__ V operator()(V x) const {
        return Sqrt(x);
    }
};
struct RsqrtF {
    template <typename V>
    __device__ V operator()(V x) const {
        return V(1) / Sqrt(x);
    }
};
struct AbsF {
    template <typename V>
    __device__ V operator()(V x) const {
        return Fabs(x);
    }
};
struct SinF {
    template <typename V>
    __device__ V operator()(V x) const {
        return Sin(x);
    }
};
struct CosF {
    template <typename V>
    __device__ V operator()(V x) const {
        return Cos(x);
    }
};
struct TanhF {
    template <typename V>
    __device__ V operator()(V x) const {
        return Tanh(x);
    }
};
struct SigmoidF {
    template <typename V>
    __device__ V operator()(V x) const {
        return Sigmoid(x);
    }
};
struct ReluF {
    template <typename V>
    __device__ V operator()(V x) const {
        return x < V(0) ? V(0) : x;  // NaN passes through
    }
};
struct SiluF {
    template <typename V>
    __device__ V operator()(V x) const {
        return x * Sigmoid(x);
    }
};
struct GeluTanhF {
    template <typename V>
    __device__ V operator()(V x) const {
        return GeluTanh(x);
    }
};

// Phi(x) = erfc(-x / sqrt 2) / 2: erfc keeps the relative accuracy of the left tail, where x Phi(x) is small.
template <typename V>
__device__ __forceinline__ V NormalCdf(V x) {
    return V(0.5) * Erfc(-x * V(0.70710678118654752440));
}

// d/dx x Phi(x) = Phi(x) + x phi(x); the tails skip inf * 0.
template <typename V>
__device__ __forceinline__ V GeluGrad(V x) {
    const V cdf = NormalCdf(x);
    const V e = Exp(V(-0.5) * x * x);
    return e == V(0) ? cdf : cdf + x * e * V(0.3989422804014327);
}

struct GeluF {
    template <typename V>
    __device__ V operator()(V x) const {
        return x * NormalCdf(x);
    }
};

#define GPU_MATH_F(Name, expr)               \
    struct Name {                            \
        template <typename V>                \
        __device__ V operator()(V x) const { \
            return expr;                     \
        }                                    \
    };
GPU_MATH_F(ErfF, Erf(x))
GPU_MATH_F(Log1pF, Log1p(x))
GPU_MATH_F(Expm1F, Expm1(x))
GPU_MATH_F(FloorF, Floor(x))
GPU_MATH_F(CeilF, Ceil(x))
GPU_MATH_F(RoundF, Rint(x))  // halves to even
GPU_MATH_F(TruncF, Trunc(x))
GPU_MATH_F(SignF, x != x ? x : V((V(0) < x) - (x < V(0))))  // NaN passes through
#undef GPU_MATH_F

template <typename V>
struct AffineF {
    V scale, bias;
    __device__ V operator()(V x) const { return x * scale + bias; }
};
template <typename V>
struct PowF {
    V p;
    __device__ V operator()(V x) const { return Pow(x, p); }
};
template <typename V>
struct ClampF {
    V lo, hi;
    __device__ V operator()(V x) const { return x < lo ? lo : (x > hi ? hi : x); }  // NaN passes through
};

// (x or out, grad) -> dx
struct TanhBackwardF {
    template <typename V>
    __device__ V operator()(V out, V g) const {
        return g * (V(1) - out * out);
    }
};
struct SigmoidBackwardF {
    template <typename V>
    __device__ V operator()(V out, V g) const {
        return g * out * (V(1) - out);
    }
};
struct ReluBackwardF {
    template <typename V>
    __device__ V operator()(V x, V g) const {
        return x > V(0) ? g : V(0);
    }
};
struct SiluBackwardF {
    template <typename V>
    __device__ V operator()(V x, V g) const {
        const V s = Sigmoid(x);
        return g * s * (V(1) + x * (V(1) - s));
    }
};
struct GeluTanhBackwardF {
    template <typename V>
    __device__ V operator()(V x, V g) const {
        return g * GeluTanhGrad(x);
    }
};
struct GeluBackwardF {
    template <typename V>
    __device__ V operator()(V x, V g) const {
        return g * GeluGrad(x);
    }
};

struct AddF {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        return a + b;
    }
};
struct SubF {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        return a - b;
    }
};
struct MulF {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        return a * b;
    }
};
struct DivF {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        return a / b;
    }
};
struct MaximumF {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        return (a > b || a != a) ? a : b;  // NaN in either propagates
    }
};
struct MinimumF {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        return (a < b || a != a) ? a : b;
    }
};
struct PowBinF {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        return Pow(a, b);
    }
};
struct FmodF {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        return Fmod(a, b);
    }
};
struct RemainderF {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        const V r = Fmod(a, b);
        return (r != V(0) && ((r < V(0)) != (b < V(0)))) ? r + b : r;  // the divisor's sign, as Python's %
    }
};
struct Atan2F {
    template <typename V>
    __device__ V operator()(V a, V b) const {
        return Atan2(a, b);
    }
};
struct SwigluF {
    template <typename V>
    __device__ V operator()(V g, V u) const {
        return g * Sigmoid(g) * u;
    }
};

struct EqF {
    template <typename V>
    __device__ bool operator()(V a, V b) const {
        return a == b;
    }
};
struct NeF {
    template <typename V>
    __device__ bool operator()(V a, V b) const {
        return a != b;
    }
};
struct LtF {
    template <typename V>
    __device__ bool operator()(V a, V b) const {
        return a < b;
    }
};
struct LeF {
    template <typename V>
    __device__ bool operator()(V a, V b) const {
        return a <= b;
    }
};
struct GtF {
    template <typename V>
    __device__ bool operator()(V a, V b) const {
        return a > b;
    }
};
struct GeF {
    template <typename V>
    __device__ bool operator()(V a, V b) const {
        return a >= b;
    }
};

// ---- storage-level functors for the maps -------------------------------------------

template <typename T, typename F>
struct UnaryFn {
    F f;
    __device__ __forceinline__ T operator()(T x) const { return FromAcc<T>(f(ToAcc(x))); }
};

template <typename T, typename F>
struct BinaryFn {
    F f;
    __device__ __forceinline__ T operator()(T a, T b) const { return FromAcc<T>(f(ToAcc(a), ToAcc(b))); }
};

// Comparison operand: integers as they are, floats in their compute type.
__device__ __forceinline__ int32_t CmpValue(int32_t v) { return v; }
__device__ __forceinline__ int64_t CmpValue(int64_t v) { return v; }
__device__ __forceinline__ float CmpValue(float v) { return v; }
__device__ __forceinline__ double CmpValue(double v) { return v; }
__device__ __forceinline__ float CmpValue(bf16_t v) { return ToFloat(v); }
__device__ __forceinline__ float CmpValue(fp16_t v) { return ToFloat(v); }

template <typename T, typename F>
struct CompareFn {
    F f;
    __device__ __forceinline__ uint8_t operator()(T a, T b) const {
        return static_cast<uint8_t>(f(CmpValue(a), CmpValue(b)));
    }
};

template <typename T>
struct AxpyFn {
    Acc<T> alpha;
    __device__ __forceinline__ T operator()(T y, T x) const { return FromAcc<T>(ToAcc(y) + alpha * ToAcc(x)); }
};

// ---- broadcasting ---------------------------------------------------------------------

template <int N>
Broadcast<N> MakeBroadcast(const char* op, const Shape& out, const std::array<const Shape*, N>& in) {
    const int64_t nd = static_cast<int64_t>(out.size());
    std::vector<std::array<int64_t, N>> st(nd);
    for (int k = 0; k < N; ++k) {
        const Shape& s = *in[k];
        const int64_t lead = nd - static_cast<int64_t>(s.size());
        int64_t step = 1;
        for (int64_t d = nd - 1; d >= 0; --d) {
            const int64_t n = d >= lead ? s[d - lead] : 1;
            st[d][k] = n == 1 ? 0 : step;
            step *= n;
        }
    }
    std::vector<int64_t> size;
    std::vector<std::array<int64_t, N>> stride;
    for (int64_t d = 0; d < nd; ++d) {
        if (out[d] == 1) continue;
        if (!size.empty()) {
            // The previous dim merges into d when stepping it once equals stepping d out[d] times, for all operands.
            bool merge = true;
            for (int k = 0; k < N; ++k) merge = merge && stride.back()[k] == st[d][k] * out[d];
            if (merge) {
                size.back() *= out[d];
                stride.back() = st[d];
                continue;
            }
        }
        size.push_back(out[d]);
        stride.push_back(st[d]);
    }
    if (static_cast<int>(size.size()) > kMaxDims) {
        OpError(op, "broadcasting over more than " + std::to_string(kMaxDims) + " non-mergeable dims is not supported");
    }
    Broadcast<N> b{};
    b.nd = static_cast<int>(size.size());
    for (int d = 0; d < b.nd; ++d) {
        b.size[d] = size[d];
        for (int k = 0; k < N; ++k) b.stride[k][d] = stride[d][k];
    }
    return b;
}

template <typename In, typename Out, typename F, typename I>
__global__ void BroadcastBinaryKernel(Broadcast<2, I> b, const In* __restrict__ x, const In* __restrict__ y,
                                      Out* __restrict__ out, I n, F f) {
    GPU_KERNEL_LOOP_T(I, i, n) {
        I off[2];
        BroadcastOffsets(b, i, off);
        out[i] = f(x[off[0]], y[off[1]]);
    }
}

// out = f(a, b) with NumPy broadcasting: flat map when the shapes are equal.
template <typename In, typename Out, typename F>
void LaunchBinary(const char* op, const Tensor& a, const Tensor& b, const Tensor& out, F f, NativeStream_t s) {
    const int64_t n = out.numel();
    if (n == 0) return;
    if (a.shape() == out.shape() && b.shape() == out.shape()) {
        Map2(a.data<In>(), b.data<In>(), out.data<Out>(), n, f, s, op);
        return;
    }
    Broadcast<2> plan = MakeBroadcast<2>(op, out.shape(), {&a.shape(), &b.shape()});
    if (Fits32(plan, n)) {
        BroadcastBinaryKernel<<<Blocks(n), kThreads, 0, s>>>(Narrow32(plan), a.data<In>(), b.data<In>(),
                                                             out.data<Out>(), static_cast<int32_t>(n), f);
    } else {
        BroadcastBinaryKernel<<<Blocks(n), kThreads, 0, s>>>(plan, a.data<In>(), b.data<In>(), out.data<Out>(), n, f);
    }
    GPU_CHECK_LAUNCH(op);
}

// out = cond ? a : b, all three broadcast; elements move as raw bits of type U.
template <typename U, typename I>
__global__ void WhereKernel(Broadcast<3, I> b, const uint8_t* __restrict__ cond, const U* __restrict__ x,
                            const U* __restrict__ y, U* __restrict__ out, I n) {
    GPU_KERNEL_LOOP_T(I, i, n) {
        I off[3];
        BroadcastOffsets(b, i, off);
        out[i] = cond[off[0]] ? x[off[1]] : y[off[2]];
    }
}

// out = mask ? value : x, mask broadcast to x's shape (x has the output's shape).
template <typename T, typename I>
__global__ void MaskedFillKernel(Broadcast<1, I> b, const T* __restrict__ x, const uint8_t* __restrict__ mask,
                                 T* __restrict__ out, I n, double value) {
    const T v = FromAcc<T>(static_cast<Acc<T>>(value));
    GPU_KERNEL_LOOP_T(I, i, n) {
        I off[1];
        BroadcastOffsets(b, i, off);
        out[i] = mask[off[0]] ? v : x[i];
    }
}

// The same over packs of kVec outputs that share one innermost-dim run (the plan's innermost size is a multiple of
// kVec): one offset computation per pack, 16-byte loads and stores of x and out, the mask read at stride mstep
// (1, or 0 where it repeats along the innermost dim).
template <typename T, int kVec, typename I>
__global__ void MaskedFillPackKernel(Broadcast<1, I> b, const T* __restrict__ x, const uint8_t* __restrict__ mask,
                                     T* __restrict__ out, I packs, I mstep, double value) {
    using P = Pack<T, kVec>;
    const T v = FromAcc<T>(static_cast<Acc<T>>(value));
    GPU_KERNEL_LOOP_T(I, q, packs) {
        I off[1];
        BroadcastOffsets(b, q * kVec, off);
        const P xp = reinterpret_cast<const P*>(x)[q];
        P r;
#pragma unroll
        for (int k = 0; k < kVec; ++k) r.v[k] = mask[off[0] + k * mstep] ? v : xp.v[k];
        reinterpret_cast<P*>(out)[q] = r;
    }
}

// dgate = grad * up * s (1 + g (1 - s)), dup = grad * g * s with s = sigmoid(gate).
template <typename T>
__global__ void SwigluBackwardKernel(const T* __restrict__ gate, const T* __restrict__ up, const T* __restrict__ grad,
                                     T* __restrict__ dgate, T* __restrict__ dup, int64_t n) {
    using V = Acc<T>;
    GPU_KERNEL_LOOP(i, n) {
        const V g = ToAcc(gate[i]), u = ToAcc(up[i]), d = ToAcc(grad[i]);
        const V s = Sigmoid(g);
        dgate[i] = FromAcc<T>(d * u * s * (V(1) + g * (V(1) - s)));
        dup[i] = FromAcc<T>(d * g * s);
    }
}

}  // namespace infinitrain::gpu
