// Elementwise kernels: unary math (and the backward kernels of the nonlinear
// ones), scalar affine/pow/clamp, broadcasting binary arithmetic and
// comparisons, where, masked_fill, axpy_, foreach_mul_ and the fused SwiGLU pair.
//
// Layout: every tensor is contiguous row-major. Broadcasting follows NumPy:
// shapes align at the last dim and a size-1 (or missing) dim repeats. An input
// of a broadcasting op is read through per-dim element strides that are 0 on
// broadcast dims; the output is walked row by row (an odometer over the outer
// dims, a tight loop over the innermost one) after dropping size-1 dims and
// merging dims that are contiguous for every operand. Equal shapes skip all that.
//
// Precision: bfloat16 loads to float and stores rounded to nearest even;
// float32 computes in float, float64 in double. Sigmoid-like functions use the
// overflow-free split at x = 0 and gelu_tanh uses 0.5 (1 + tanh u) = sigmoid(2u)
// so that the left tail keeps its relative accuracy.
//
// Comparisons write bool as uint8 0/1. maximum/minimum propagate NaN. The exact GELU and erf use the float
// erfc of fastmath.h (relative error near 1e-7 in both tails) for every type but double.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "infinitrain/kernels/cpu/common.h"
#include "infinitrain/kernels/cpu/fastmath.h"

namespace infinitrain::cpu {
namespace {

// ---- broadcast iteration ----------------------------------------------------

// Output dims after dropping size-1 dims and merging contiguous runs, with each
// operand's element stride per dim (0 where that operand is broadcast).
template <int N>
struct BroadcastPlan {
    std::vector<int64_t> size;
    std::vector<std::array<int64_t, N>> stride;
};

template <int N>
BroadcastPlan<N> MakePlan(const Shape& out, const std::array<const Shape*, N>& in) {
    const int64_t nd = static_cast<int64_t>(out.size());
    std::vector<std::array<int64_t, N>> st(nd);
    for (int k = 0; k < N; ++k) {
        const Shape& s = *in[k];
        const int64_t lead = nd - static_cast<int64_t>(s.size());
        int64_t step = 1;
        for (int64_t d = nd - 1; d >= 0; --d) {
            int64_t n = d >= lead ? s[d - lead] : 1;
            st[d][k] = n == 1 ? 0 : step;
            step *= n;
        }
    }
    BroadcastPlan<N> p;
    for (int64_t d = 0; d < nd; ++d) {
        if (out[d] == 1) continue;
        if (!p.size.empty()) {
            // Outer dim `last` merges into d when stepping it once equals stepping d out[d] times, for all operands.
            bool merge = true;
            for (int k = 0; k < N; ++k) merge = merge && p.stride.back()[k] == st[d][k] * out[d];
            if (merge) {
                p.size.back() *= out[d];
                p.stride.back() = st[d];
                continue;
            }
        }
        p.size.push_back(out[d]);
        p.stride.push_back(st[d]);
    }
    if (p.size.empty()) {  // all dims 1: one element
        p.size.push_back(1);
        p.stride.push_back({});
    }
    return p;
}

// Calls f(o, off, n, inner) for each piece of an output row: output elements
// [o, o + n) read operand k at off[k] + j * inner[k] for j in [0, n). Rows are
// cut into blocks so that one long row (a tensor op a scalar) still runs in parallel.
template <int N, typename F>
void ForEachRow(const Shape& out, const std::array<const Shape*, N>& in, int64_t cost, F&& f) {
    const int64_t numel = Numel(out);
    if (numel == 0) return;
    BroadcastPlan<N> p = MakePlan<N>(out, in);
    const int64_t nd = static_cast<int64_t>(p.size.size());
    const int64_t inner = p.size.back();
    const std::array<int64_t, N> inner_stride = p.stride.back();
    constexpr int64_t kBlock = 1 << 13;
    const int64_t blocks = (inner + kBlock - 1) / kBlock;
    const int64_t rows = numel / inner;
    ParallelFor(rows * blocks, std::min(inner, kBlock) * cost, [&](int64_t begin, int64_t end) {
        // Odometer over the outer dims, started at the row of item `begin`.
        std::vector<int64_t> idx(nd, 0);
        std::array<int64_t, N> off{};
        int64_t row = begin / blocks, blk = begin % blocks;
        for (int64_t d = nd - 2, r = row; d >= 0; --d) {
            idx[d] = r % p.size[d];
            r /= p.size[d];
            for (int k = 0; k < N; ++k) off[k] += idx[d] * p.stride[d][k];
        }
        for (int64_t item = begin; item < end; ++item) {
            const int64_t j0 = blk * kBlock;
            std::array<int64_t, N> o = off;
            for (int k = 0; k < N; ++k) o[k] += j0 * inner_stride[k];
            f(row * inner + j0, o, std::min(kBlock, inner - j0), inner_stride);
            if (++blk < blocks) continue;
            blk = 0;
            ++row;
            for (int64_t d = nd - 2; d >= 0; --d) {
                for (int k = 0; k < N; ++k) off[k] += p.stride[d][k];
                if (++idx[d] < p.size[d]) break;
                for (int k = 0; k < N; ++k) off[k] -= idx[d] * p.stride[d][k];
                idx[d] = 0;
            }
        }
    });
}

// ---- unary --------------------------------------------------------------------

// float (also the compute type of bfloat16 and float16): branch-free on ExpF, so loops of it vectorise.
INFINITRAIN_ALWAYS_INLINE float Sigmoid(float x) {
    float e = ExpF(-std::fabs(x));  // in (0, 1]: no overflow on either side
    float r = 1.0f / (1.0f + e);
    return x >= 0.0f ? r : e * r;  // NaN: e is NaN, so is r
}

template <typename V>
V Sigmoid(V x) {
    if (x >= 0) return V(1) / (V(1) + std::exp(-x));
    V e = std::exp(x);  // x < 0 (or NaN): e in (0, 1), no overflow
    return e / (V(1) + e);
}

template <typename V>
constexpr V kGeluK0 = V(0.7978845608028654);  // sqrt(2 / pi)
template <typename V>
constexpr V kGeluK1 = V(0.044715);

// gelu_tanh(x) = 0.5 x (1 + tanh u) = x * sigmoid(2u), u = k0 (x + k1 x^3).
template <typename V>
INFINITRAIN_ALWAYS_INLINE V GeluTanh(V x) {
    V u = kGeluK0<V> * (x + kGeluK1<V> * x * x * x);
    return x * Sigmoid(V(2) * u);
}

// d/dx: s + 2 x s (1 - s) u' with s = sigmoid(2u), u' = k0 (1 + 3 k1 x^2).
template <typename V>
INFINITRAIN_ALWAYS_INLINE V GeluTanhGrad(V x) {
    V u = kGeluK0<V> * (x + kGeluK1<V> * x * x * x);
    V s = Sigmoid(V(2) * u);
    V t = s * (V(1) - s);
    V d = s + V(2) * x * t * kGeluK0<V> * (V(1) + V(3) * kGeluK1<V> * x * x);
    return t == V(0) ? s : d;  // saturated tails: not 0 * inf when x^2 overflows (a select, so loops vectorise)
}

struct NegOp {
    static constexpr const char* kName = "neg";
    template <typename V>
    V operator()(V x) const {
        return -x;
    }
};
struct ExpOp {
    static constexpr const char* kName = "exp";
    template <typename V>
    V operator()(V x) const {
        return std::exp(x);
    }
};
struct LogOp {
    static constexpr const char* kName = "log";
    template <typename V>
    V operator()(V x) const {
        return std::log(x);
    }
};
struct SqrtOp {
    static constexpr const char* kName = "sqrt";
    template <typename V>
    V operator()(V x) const {
        return std::sqrt(x);
    }
};
struct RsqrtOp {
    static constexpr const char* kName = "rsqrt";
    template <typename V>
    V operator()(V x) const {
        return V(1) / std::sqrt(x);
    }
};
struct AbsOp {
    static constexpr const char* kName = "abs";
    template <typename V>
    V operator()(V x) const {
        return std::abs(x);
    }
};
struct SinOp {
    static constexpr const char* kName = "sin";
    template <typename V>
    V operator()(V x) const {
        return std::sin(x);
    }
};
struct CosOp {
    static constexpr const char* kName = "cos";
    template <typename V>
    V operator()(V x) const {
        return std::cos(x);
    }
};
struct TanhOp {
    static constexpr const char* kName = "tanh";
    template <typename V>
    V operator()(V x) const {
        return std::tanh(x);
    }
};
struct SigmoidOp {
    static constexpr const char* kName = "sigmoid";
    template <typename V>
    V operator()(V x) const {
        return Sigmoid(x);
    }
};
struct ReluOp {
    static constexpr const char* kName = "relu";
    template <typename V>
    V operator()(V x) const {
        return x < V(0) ? V(0) : x;  // NaN passes through
    }
};
struct SiluOp {
    static constexpr const char* kName = "silu";
    template <typename V>
    V operator()(V x) const {
        return x * Sigmoid(x);
    }
};
struct GeluTanhOp {
    static constexpr const char* kName = "gelu_tanh";
    template <typename V>
    V operator()(V x) const {
        return GeluTanh(x);
    }
};

// The exact GELU, x Phi(x), and Phi itself: the vectorising float forms for float and the 16-bit types, libm's
// erfc for double.
INFINITRAIN_ALWAYS_INLINE float NormalCdf(float x) { return NormalCdfF(x); }
INFINITRAIN_ALWAYS_INLINE double NormalCdf(double x) { return 0.5 * std::erfc(-x * 0.70710678118654752440); }
INFINITRAIN_ALWAYS_INLINE float Erf(float x) { return ErfF(x); }
INFINITRAIN_ALWAYS_INLINE double Erf(double x) { return std::erf(x); }

// d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = e^(-x^2/2) / sqrt(2 pi); the tails skip inf * 0.
template <typename V>
INFINITRAIN_ALWAYS_INLINE V GeluGrad(V x) {
    V cdf = NormalCdf(x);
    V e = Exp(V(-0.5) * x * x);
    V d = cdf + x * e * V(0.3989422804014327);
    return e == V(0) ? cdf : d;
}

struct GeluOp {
    static constexpr const char* kName = "gelu";
    template <typename V>
    V operator()(V x) const {
        return x * NormalCdf(x);
    }
};
struct ErfOp {
    static constexpr const char* kName = "erf";
    template <typename V>
    V operator()(V x) const {
        return Erf(x);
    }
};
struct Log1pOp {
    static constexpr const char* kName = "log1p";
    template <typename V>
    V operator()(V x) const {
        return std::log1p(x);
    }
};
struct Expm1Op {
    static constexpr const char* kName = "expm1";
    template <typename V>
    V operator()(V x) const {
        return std::expm1(x);
    }
};
struct FloorOp {
    static constexpr const char* kName = "floor";
    template <typename V>
    V operator()(V x) const {
        return std::floor(x);
    }
};
struct CeilOp {
    static constexpr const char* kName = "ceil";
    template <typename V>
    V operator()(V x) const {
        return std::ceil(x);
    }
};
struct RoundOp {
    static constexpr const char* kName = "round";
    template <typename V>
    V operator()(V x) const {
        return std::nearbyint(x);  // halves to even, as PyTorch's round
    }
};
struct TruncOp {
    static constexpr const char* kName = "trunc";
    template <typename V>
    V operator()(V x) const {
        return std::trunc(x);
    }
};
struct SignOp {
    static constexpr const char* kName = "sign";
    template <typename V>
    V operator()(V x) const {
        return x != x ? x : V((V(0) < x) - (x < V(0)));  // NaN passes through
    }
};

// out[i] = f(x[i]) in the accumulation type.
template <typename T, typename F>
void MapUnary(const Tensor& x, const Tensor& out, int64_t cost, F f) {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    ParallelFor(x.numel(), cost, [&](int64_t b, int64_t e) {
#pragma omp simd
        for (int64_t i = b; i < e; ++i) Store(po + i, f(Load(px + i)));
    });
}

template <typename Op>
INFINITRAIN_SIMD_CLONES void MapFloat(const float* x, float* y, int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = Op()(x[i]);
}

template <typename Op>
INFINITRAIN_SIMD_CLONES void MapFloat2(const float* x, const float* g, float* y, int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = Op()(x[i], g[i]);
}

template <typename Op>
void UnaryKernel(KernelContext& c) {
    DispatchFloat(c.in[0].dtype(), Op::kName, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float>) {
            const float* px = c.in[0].data<float>();
            float* po = c.out[0].data<float>();
            ParallelFor(c.in[0].numel(), 8, [&](int64_t b, int64_t e) { MapFloat<Op>(px, po, b, e); });
        } else {
            MapUnary<T>(c.in[0], c.out[0], 8, [](Acc<T> v) { return Op()(v); });
        }
    });
}

void AffineKernel(KernelContext& c) {
    DispatchFloat(c.in[0].dtype(), "affine", [&](auto tag) {
        using T = decltype(tag);
        using V = Acc<T>;
        V scale = static_cast<V>(c.f(0)), bias = static_cast<V>(c.f(1));
        MapUnary<T>(c.in[0], c.out[0], 1, [=](V v) { return v * scale + bias; });
    });
}

void PowScalarKernel(KernelContext& c) {
    DispatchFloat(c.in[0].dtype(), "pow_scalar", [&](auto tag) {
        using T = decltype(tag);
        using V = Acc<T>;
        V p = static_cast<V>(c.f(0));
        MapUnary<T>(c.in[0], c.out[0], 16, [=](V v) { return std::pow(v, p); });
    });
}

void ClampKernel(KernelContext& c) {
    DispatchFloat(c.in[0].dtype(), "clamp", [&](auto tag) {
        using T = decltype(tag);
        using V = Acc<T>;
        V lo = static_cast<V>(c.f(0)), hi = static_cast<V>(c.f(1));
        // Comparisons written so that NaN passes through.
        MapUnary<T>(c.in[0], c.out[0], 1, [=](V v) { return v < lo ? lo : (v > hi ? hi : v); });
    });
}

// ---- unary backward: dx[i] = grad[i] * f'(...) from (x or out, grad) ------------

struct TanhBackwardOp {
    static constexpr const char* kName = "tanh_backward";
    template <typename V>
    V operator()(V out, V g) const {
        return g * (V(1) - out * out);
    }
};
struct SigmoidBackwardOp {
    static constexpr const char* kName = "sigmoid_backward";
    template <typename V>
    V operator()(V out, V g) const {
        return g * out * (V(1) - out);
    }
};
struct ReluBackwardOp {
    static constexpr const char* kName = "relu_backward";
    template <typename V>
    V operator()(V x, V g) const {
        return x > V(0) ? g : V(0);
    }
};
struct SiluBackwardOp {
    static constexpr const char* kName = "silu_backward";
    template <typename V>
    V operator()(V x, V g) const {
        V s = Sigmoid(x);
        return g * s * (V(1) + x * (V(1) - s));
    }
};
struct GeluTanhBackwardOp {
    static constexpr const char* kName = "gelu_tanh_backward";
    template <typename V>
    V operator()(V x, V g) const {
        return g * GeluTanhGrad(x);
    }
};
struct GeluBackwardOp {
    static constexpr const char* kName = "gelu_backward";
    template <typename V>
    V operator()(V x, V g) const {
        return g * GeluGrad(x);
    }
};

template <typename Op>
void UnaryBackwardKernel(KernelContext& c) {
    DispatchFloat(c.in[0].dtype(), Op::kName, [&](auto tag) {
        using T = decltype(tag);
        const T* px = c.in[0].data<T>();
        const T* pg = c.in[1].data<T>();
        T* po = c.out[0].data<T>();
        if constexpr (std::is_same_v<T, float>) {
            ParallelFor(c.in[0].numel(), 8, [&](int64_t b, int64_t e) { MapFloat2<Op>(px, pg, po, b, e); });
            return;
        }
        ParallelFor(c.in[0].numel(), 8, [&](int64_t b, int64_t e) {
#pragma omp simd
            for (int64_t i = b; i < e; ++i) Store(po + i, Op()(Load(px + i), Load(pg + i)));
        });
    });
}

// ---- binary arithmetic with broadcasting ---------------------------------------

struct AddOp {
    static constexpr const char* kName = "add";
    template <typename V>
    V operator()(V a, V b) const {
        return a + b;
    }
};
struct SubOp {
    static constexpr const char* kName = "sub";
    template <typename V>
    V operator()(V a, V b) const {
        return a - b;
    }
};
struct MulOp {
    static constexpr const char* kName = "mul";
    template <typename V>
    V operator()(V a, V b) const {
        return a * b;
    }
};
struct DivOp {
    static constexpr const char* kName = "div";
    template <typename V>
    V operator()(V a, V b) const {
        return a / b;
    }
};
struct MaximumOp {
    static constexpr const char* kName = "maximum";
    template <typename V>
    V operator()(V a, V b) const {
        return (a > b || a != a) ? a : b;  // NaN in either propagates
    }
};
struct MinimumOp {
    static constexpr const char* kName = "minimum";
    template <typename V>
    V operator()(V a, V b) const {
        return (a < b || a != a) ? a : b;
    }
};

struct PowOp {
    static constexpr const char* kName = "pow";
    template <typename V>
    V operator()(V a, V b) const {
        return std::pow(a, b);
    }
};
struct FmodOp {
    static constexpr const char* kName = "fmod";
    template <typename V>
    V operator()(V a, V b) const {
        return std::fmod(a, b);
    }
};
struct RemainderOp {
    static constexpr const char* kName = "remainder";
    template <typename V>
    V operator()(V a, V b) const {
        V r = std::fmod(a, b);
        return (r != V(0) && ((r < V(0)) != (b < V(0)))) ? r + b : r;  // the divisor's sign, as Python's %
    }
};
struct Atan2Op {
    static constexpr const char* kName = "atan2";
    template <typename V>
    V operator()(V a, V b) const {
        return std::atan2(a, b);
    }
};

// out = f(a, b) with a, b of type T (loaded to its compute type) and out of type O.
template <typename T, typename O, typename F>
void BinaryLoop(const Tensor& a, const Tensor& b, const Tensor& out, int64_t cost, F f) {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    O* po = out.data<O>();
    if (a.shape() == out.shape() && b.shape() == out.shape()) {
        ParallelFor(out.numel(), cost, [&](int64_t s, int64_t e) {
            for (int64_t i = s; i < e; ++i) po[i] = f(pa + i, pb + i);
        });
        return;
    }
    ForEachRow<2>(out.shape(), {&a.shape(), &b.shape()}, cost,
                  [&](int64_t o, const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& s) {
                      const T* x = pa + off[0];
                      const T* y = pb + off[1];
                      O* z = po + o;
                      // The common inner patterns get their own loops so they vectorise.
                      if (s[0] == 1 && s[1] == 1) {
                          for (int64_t j = 0; j < n; ++j) z[j] = f(x + j, y + j);
                      } else if (s[0] == 1 && s[1] == 0) {
                          for (int64_t j = 0; j < n; ++j) z[j] = f(x + j, y);
                      } else if (s[0] == 0 && s[1] == 1) {
                          for (int64_t j = 0; j < n; ++j) z[j] = f(x, y + j);
                      } else {
                          for (int64_t j = 0; j < n; ++j) z[j] = f(x + j * s[0], y + j * s[1]);
                      }
                  });
}

template <typename Op>
void BinaryKernel(KernelContext& c) {
    DispatchFloat(c.in[0].dtype(), Op::kName, [&](auto tag) {
        using T = decltype(tag);
        BinaryLoop<T, T>(c.in[0], c.in[1], c.out[0], 1, [](const T* x, const T* y) {
            T r;
            Store(&r, Op()(Load(x), Load(y)));
            return r;
        });
    });
}

// ---- comparisons: float32/bfloat16/float64/int32/int64 -> bool (uint8 0/1) -----

inline int32_t LoadCmp(const int32_t* p) { return *p; }
inline int64_t LoadCmp(const int64_t* p) { return *p; }
inline float LoadCmp(const float* p) { return *p; }
inline double LoadCmp(const double* p) { return *p; }
inline float LoadCmp(const bf16* p) { return Load(p); }
inline float LoadCmp(const f16* p) { return Load(p); }

struct EqOp {
    static constexpr const char* kName = "eq";
    template <typename V>
    bool operator()(V a, V b) const {
        return a == b;
    }
};
struct NeOp {
    static constexpr const char* kName = "ne";
    template <typename V>
    bool operator()(V a, V b) const {
        return a != b;
    }
};
struct LtOp {
    static constexpr const char* kName = "lt";
    template <typename V>
    bool operator()(V a, V b) const {
        return a < b;
    }
};
struct LeOp {
    static constexpr const char* kName = "le";
    template <typename V>
    bool operator()(V a, V b) const {
        return a <= b;
    }
};
struct GtOp {
    static constexpr const char* kName = "gt";
    template <typename V>
    bool operator()(V a, V b) const {
        return a > b;
    }
};
struct GeOp {
    static constexpr const char* kName = "ge";
    template <typename V>
    bool operator()(V a, V b) const {
        return a >= b;
    }
};

template <typename Op>
void CompareKernel(KernelContext& c) {
    auto run = [&](auto tag) {
        using T = decltype(tag);
        BinaryLoop<T, uint8_t>(c.in[0], c.in[1], c.out[0], 1, [](const T* x, const T* y) {
            return static_cast<uint8_t>(Op()(LoadCmp(x), LoadCmp(y)));
        });
    };
    switch (c.in[0].dtype()) {
        case DataType::kInt32:
            return run(int32_t{});
        case DataType::kInt64:
            return run(int64_t{});
        default:
            DispatchFloat(c.in[0].dtype(), Op::kName, run);
    }
}

// ---- where, masked_fill ----------------------------------------------------------

void WhereKernel(KernelContext& c) {
    const Tensor &cond = c.in[0], &a = c.in[1], &b = c.in[2];
    Tensor& out = c.out[0];
    DispatchFloat(a.dtype(), "where", [&](auto tag) {
        using T = decltype(tag);
        const uint8_t* pc = cond.data<uint8_t>();
        const T* pa = a.data<T>();
        const T* pb = b.data<T>();
        T* po = out.data<T>();
        // Copying storage bits keeps the select exact for every dtype.
        ForEachRow<3>(out.shape(), {&cond.shape(), &a.shape(), &b.shape()}, 1,
                      [&](int64_t o, const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& s) {
                          for (int64_t j = 0; j < n; ++j) {
                              po[o + j] = pc[off[0] + j * s[0]] ? pa[off[1] + j * s[1]] : pb[off[2] + j * s[2]];
                          }
                      });
    });
}

void MaskedFillKernel(KernelContext& c) {
    const Tensor &x = c.in[0], &mask = c.in[1];
    Tensor& out = c.out[0];
    DispatchFloat(x.dtype(), "masked_fill", [&](auto tag) {
        using T = decltype(tag);
        T value;
        Store(&value, static_cast<Acc<T>>(c.f(0)));
        const T* px = x.data<T>();
        const uint8_t* pm = mask.data<uint8_t>();
        T* po = out.data<T>();
        // out has x's shape, so x's offset is the output offset.
        ForEachRow<2>(out.shape(), {&x.shape(), &mask.shape()}, 1,
                      [&](int64_t o, const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& s) {
                          for (int64_t j = 0; j < n; ++j) po[o + j] = pm[off[1] + j * s[1]] ? value : px[o + j];
                      });
    });
}

// ---- axpy_, foreach_mul_, swiglu -------------------------------------------------------

void AxpyKernel(KernelContext& c) {
    DispatchFloat(c.in[0].dtype(), "axpy_", [&](auto tag) {
        using T = decltype(tag);
        using V = Acc<T>;
        T* py = c.in[0].data<T>();
        const T* px = c.in[1].data<T>();
        V alpha = static_cast<V>(c.f(0));
        ParallelFor(c.in[0].numel(), 1, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) Store(py + i, Load(py + i) + alpha * Load(px + i));
        });
    });
}

// foreach_mul_: x *= scale over every x, in pieces across threads; scale is read as the compute type (float, double
// for float64 xs), so the product rounds once to the storage type.
void ForeachMulKernel(KernelContext& c) {
    double scale = 0.0;
    DispatchFloat(c.in[0].dtype(), "foreach_mul_", [&](auto tag) { scale = Load(c.in[0].data<decltype(tag)>()); });
    constexpr int64_t kChunk = 1 << 14;
    const std::vector<ForeachPiece> pieces = ForeachPieces(c.in, 1, c.in.size() - 1, kChunk);
    DispatchFloat(c.in[1].dtype(), "foreach_mul_", [&](auto tag) {
        using T = decltype(tag);
        using V = Acc<T>;
        const V s = static_cast<V>(scale);
        std::vector<T*> xs;
        for (size_t k = 1; k < c.in.size(); ++k) xs.push_back(c.in[k].data<T>());
        ParallelFor(static_cast<int64_t>(pieces.size()), kChunk, [&](int64_t b, int64_t e) {
            for (int64_t k = b; k < e; ++k) {
                T* x = xs[pieces[k].t];
                for (int64_t i = pieces[k].begin; i < pieces[k].end; ++i) Store(x + i, Load(x + i) * s);
            }
        });
    });
}

INFINITRAIN_SIMD_CLONES void SwigluFloat(const float* g, const float* u, float* o, int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) o[i] = g[i] * Sigmoid(g[i]) * u[i];
}

void SwigluKernel(KernelContext& c) {
    DispatchFloat(c.in[0].dtype(), "swiglu", [&](auto tag) {
        using T = decltype(tag);
        const T* pg = c.in[0].data<T>();
        const T* pu = c.in[1].data<T>();
        T* po = c.out[0].data<T>();
        if constexpr (std::is_same_v<T, float>) {  // vectorised as silu is (a scalar loop ran 10x slower)
            ParallelFor(c.in[0].numel(), 8, [&](int64_t b, int64_t e) { SwigluFloat(pg, pu, po, b, e); });
            return;
        }
        ParallelFor(c.in[0].numel(), 8, [&](int64_t b, int64_t e) {
#pragma omp simd
            for (int64_t i = b; i < e; ++i) {
                auto g = Load(pg + i);
                Store(po + i, g * Sigmoid(g) * Load(pu + i));
            }
        });
    });
}

// out = silu(g) * u: dgate = grad * u * s (1 + g (1 - s)), dup = grad * g * s, s = sigmoid(g).
INFINITRAIN_SIMD_CLONES void SwigluBackwardFloat(const float* g, const float* u, const float* d, float* dg, float* du,
                                                 int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
        float s = Sigmoid(g[i]);
        dg[i] = d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        du[i] = d[i] * g[i] * s;
    }
}

void SwigluBackwardKernel(KernelContext& c) {
    DispatchFloat(c.in[0].dtype(), "swiglu_backward", [&](auto tag) {
        using T = decltype(tag);
        using V = Acc<T>;
        const T* pg = c.in[0].data<T>();
        const T* pu = c.in[1].data<T>();
        const T* pd = c.in[2].data<T>();
        T* dg = c.out[0].data<T>();
        T* du = c.out[1].data<T>();
        if constexpr (std::is_same_v<T, float>) {
            ParallelFor(c.in[0].numel(), 8,
                        [&](int64_t b, int64_t e) { SwigluBackwardFloat(pg, pu, pd, dg, du, b, e); });
            return;
        }
        ParallelFor(c.in[0].numel(), 8, [&](int64_t b, int64_t e) {
#pragma omp simd
            for (int64_t i = b; i < e; ++i) {
                V g = Load(pg + i), u = Load(pu + i), d = Load(pd + i);
                V s = Sigmoid(g);
                Store(dg + i, d * u * s * (V(1) + g * (V(1) - s)));
                Store(du + i, d * g * s);
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "neg", UnaryKernel<NegOp>);
REGISTER_KERNEL(DeviceType::kCPU, "exp", UnaryKernel<ExpOp>);
REGISTER_KERNEL(DeviceType::kCPU, "log", UnaryKernel<LogOp>);
REGISTER_KERNEL(DeviceType::kCPU, "sqrt", UnaryKernel<SqrtOp>);
REGISTER_KERNEL(DeviceType::kCPU, "rsqrt", UnaryKernel<RsqrtOp>);
REGISTER_KERNEL(DeviceType::kCPU, "abs", UnaryKernel<AbsOp>);
REGISTER_KERNEL(DeviceType::kCPU, "sin", UnaryKernel<SinOp>);
REGISTER_KERNEL(DeviceType::kCPU, "cos", UnaryKernel<CosOp>);
REGISTER_KERNEL(DeviceType::kCPU, "tanh", UnaryKernel<TanhOp>);
REGISTER_KERNEL(DeviceType::kCPU, "sigmoid", UnaryKernel<SigmoidOp>);
REGISTER_KERNEL(DeviceType::kCPU, "relu", UnaryKernel<ReluOp>);
REGISTER_KERNEL(DeviceType::kCPU, "silu", UnaryKernel<SiluOp>);
REGISTER_KERNEL(DeviceType::kCPU, "gelu_tanh", UnaryKernel<GeluTanhOp>);
REGISTER_KERNEL(DeviceType::kCPU, "gelu", UnaryKernel<GeluOp>);
REGISTER_KERNEL(DeviceType::kCPU, "erf", UnaryKernel<ErfOp>);
REGISTER_KERNEL(DeviceType::kCPU, "log1p", UnaryKernel<Log1pOp>);
REGISTER_KERNEL(DeviceType::kCPU, "expm1", UnaryKernel<Expm1Op>);
REGISTER_KERNEL(DeviceType::kCPU, "floor", UnaryKernel<FloorOp>);
REGISTER_KERNEL(DeviceType::kCPU, "ceil", UnaryKernel<CeilOp>);
REGISTER_KERNEL(DeviceType::kCPU, "round", UnaryKernel<RoundOp>);
REGISTER_KERNEL(DeviceType::kCPU, "trunc", UnaryKernel<TruncOp>);
REGISTER_KERNEL(DeviceType::kCPU, "sign", UnaryKernel<SignOp>);
REGISTER_KERNEL(DeviceType::kCPU, "affine", AffineKernel);
REGISTER_KERNEL(DeviceType::kCPU, "pow_scalar", PowScalarKernel);
REGISTER_KERNEL(DeviceType::kCPU, "clamp", ClampKernel);
REGISTER_KERNEL(DeviceType::kCPU, "tanh_backward", UnaryBackwardKernel<TanhBackwardOp>);
REGISTER_KERNEL(DeviceType::kCPU, "sigmoid_backward", UnaryBackwardKernel<SigmoidBackwardOp>);
REGISTER_KERNEL(DeviceType::kCPU, "relu_backward", UnaryBackwardKernel<ReluBackwardOp>);
REGISTER_KERNEL(DeviceType::kCPU, "silu_backward", UnaryBackwardKernel<SiluBackwardOp>);
REGISTER_KERNEL(DeviceType::kCPU, "gelu_tanh_backward", UnaryBackwardKernel<GeluTanhBackwardOp>);
REGISTER_KERNEL(DeviceType::kCPU, "gelu_backward", UnaryBackwardKernel<GeluBackwardOp>);
REGISTER_KERNEL(DeviceType::kCPU, "add", BinaryKernel<AddOp>);
REGISTER_KERNEL(DeviceType::kCPU, "sub", BinaryKernel<SubOp>);
REGISTER_KERNEL(DeviceType::kCPU, "mul", BinaryKernel<MulOp>);
REGISTER_KERNEL(DeviceType::kCPU, "div", BinaryKernel<DivOp>);
REGISTER_KERNEL(DeviceType::kCPU, "maximum", BinaryKernel<MaximumOp>);
REGISTER_KERNEL(DeviceType::kCPU, "minimum", BinaryKernel<MinimumOp>);
REGISTER_KERNEL(DeviceType::kCPU, "pow", BinaryKernel<PowOp>);
REGISTER_KERNEL(DeviceType::kCPU, "fmod", BinaryKernel<FmodOp>);
REGISTER_KERNEL(DeviceType::kCPU, "remainder", BinaryKernel<RemainderOp>);
REGISTER_KERNEL(DeviceType::kCPU, "atan2", BinaryKernel<Atan2Op>);
REGISTER_KERNEL(DeviceType::kCPU, "eq", CompareKernel<EqOp>);
REGISTER_KERNEL(DeviceType::kCPU, "ne", CompareKernel<NeOp>);
REGISTER_KERNEL(DeviceType::kCPU, "lt", CompareKernel<LtOp>);
REGISTER_KERNEL(DeviceType::kCPU, "le", CompareKernel<LeOp>);
REGISTER_KERNEL(DeviceType::kCPU, "gt", CompareKernel<GtOp>);
REGISTER_KERNEL(DeviceType::kCPU, "ge", CompareKernel<GeOp>);
REGISTER_KERNEL(DeviceType::kCPU, "where", WhereKernel);
REGISTER_KERNEL(DeviceType::kCPU, "masked_fill", MaskedFillKernel);
REGISTER_KERNEL(DeviceType::kCPU, "axpy_", AxpyKernel);
REGISTER_KERNEL(DeviceType::kCPU, "foreach_mul_", ForeachMulKernel);
REGISTER_KERNEL(DeviceType::kCPU, "swiglu", SwigluKernel);
REGISTER_KERNEL(DeviceType::kCPU, "swiglu_backward", SwigluBackwardKernel);

}  // namespace infinitrain::cpu
