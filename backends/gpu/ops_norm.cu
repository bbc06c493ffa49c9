// Op adapters for softmax, log_softmax, their backwards, layernorm, rmsnorm, their residual-add forms and their
// backwards (kernels in norm.cuh).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "backends/gpu/context.h"
#include "backends/gpu/norm.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

struct Layout {
    int64_t outer, n, inner;
};

Layout SoftmaxLayout(const char* op, const Tensor& x, int64_t dim) {
    const int64_t d = NormalizeDim(op, dim, x.dim());
    Layout l{1, x.shape()[d], 1};
    for (int64_t i = 0; i < d; ++i) l.outer *= x.shape()[i];
    for (int64_t i = d + 1; i < x.dim(); ++i) l.inner *= x.shape()[i];
    return l;
}

constexpr int64_t kGroupRowMax = 1024;  // rows up to this length get a 32-lane group, longer ones a block

// Calls f(std::integral_constant<int, kPer>) with the fewest values per lane that hold a row of C elements in a
// 32-lane group; false when C is longer than kGroupRowMax.
template <typename F>
bool DispatchPerLane(int64_t C, F&& f) {
    if (C <= 8 * kGroup) {
        f(std::integral_constant<int, 8>{});
    } else if (C <= 16 * kGroup) {
        f(std::integral_constant<int, 16>{});
    } else if (C <= 24 * kGroup) {
        f(std::integral_constant<int, 24>{});
    } else if (C <= 32 * kGroup) {
        f(std::integral_constant<int, 32>{});
    } else {
        return false;
    }
    return true;
}

template <bool kLog>
void SoftmaxForward(KernelContext& ctx, const char* op) {
    const Tensor &x = ctx.in[0], &y = ctx.out[0];
    const Layout l = SoftmaxLayout(op, x, ctx.i(0));
    if (x.numel() == 0) return;
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(x.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (l.inner > 1) {
            SoftmaxColsKernel<kLog, T>
                <<<Blocks(l.outer * l.inner), kThreads, 0, s>>>(x.data<T>(), y.data<T>(), l.outer, l.n, l.inner);
        } else if (l.n <= kGroupRowMax) {
            SoftmaxRowsKernel<kLog, false, T>
                <<<Blocks(l.outer, kThreads / kGroup), kThreads, 0, s>>>(x.data<T>(), y.data<T>(), l.outer, l.n);
        } else {
            SoftmaxRowsKernel<kLog, true, T>
                <<<Blocks(l.outer, 1), RowBlockThreads(l.n), 0, s>>>(x.data<T>(), y.data<T>(), l.outer, l.n);
        }
    });
    GPU_CHECK_LAUNCH(op);
}

template <bool kLog>
void SoftmaxBackward(KernelContext& ctx, const char* op) {
    const Tensor &y = ctx.in[0], &g = ctx.in[1], &dx = ctx.out[0];
    const Layout l = SoftmaxLayout(op, y, ctx.i(0));
    if (y.numel() == 0) return;
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(y.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (l.inner > 1) {
            SoftmaxBackwardColsKernel<kLog, T><<<Blocks(l.outer * l.inner), kThreads, 0, s>>>(
                y.data<T>(), g.data<T>(), dx.data<T>(), l.outer, l.n, l.inner);
        } else if (l.n <= kGroupRowMax) {
            SoftmaxBackwardRowsKernel<kLog, false, T><<<Blocks(l.outer, kThreads / kGroup), kThreads, 0, s>>>(
                y.data<T>(), g.data<T>(), dx.data<T>(), l.outer, l.n);
        } else {
            SoftmaxBackwardRowsKernel<kLog, true, T><<<Blocks(l.outer, 1), RowBlockThreads(l.n), 0, s>>>(
                y.data<T>(), g.data<T>(), dx.data<T>(), l.outer, l.n);
        }
    });
    GPU_CHECK_LAUNCH(op);
}

void Softmax(KernelContext& ctx) { SoftmaxForward<false>(ctx, "softmax"); }
void LogSoftmax(KernelContext& ctx) { SoftmaxForward<true>(ctx, "log_softmax"); }
void SoftmaxBackwardOp(KernelContext& ctx) { SoftmaxBackward<false>(ctx, "softmax_backward"); }
void LogSoftmaxBackward(KernelContext& ctx) { SoftmaxBackward<true>(ctx, "log_softmax_backward"); }

// Calls f(Tag<T>, Tag<Y>, Tag<O>) with a norm's x type T, y's Y and out's O: all T, or for float32 x a
// 16-bit O with Y float32 or O (the shape rules admit nothing else).
template <typename F>
void DispatchNormTypes(const char* op, DataType t, DataType y, DataType o, F&& f) {
    if (t != DataType::kFloat32 || o == t) {
        DispatchFloat(t, op, [&](auto tag) {
            using T = typename decltype(tag)::type;
            f(Tag<T>{}, Tag<T>{}, Tag<T>{});
        });
        return;
    }
    auto with = [&](auto o16) {
        if (y == t) {
            f(Tag<float>{}, Tag<float>{}, o16);
        } else {
            f(Tag<float>{}, o16, o16);
        }
    };
    if (o == DataType::kBFloat16) {
        with(Tag<bf16_t>{});
    } else {
        with(Tag<fp16_t>{});
    }
}

// in: x, weight, [bias]; out: y, [mean,] rstd. With kAdd (add_layernorm, add_rmsnorm) in: x, a, weight, [bias];
// out: sum, y, [mean,] rstd.
template <bool kRms, bool kAdd>
void NormForward(KernelContext& ctx, const char* op) {
    const int k0 = kAdd ? 1 : 0;
    const Tensor &x = ctx.in[0], &w = ctx.in[1 + k0];
    const Tensor* add = kAdd ? &ctx.in[1] : nullptr;
    const Tensor* bias = kRms ? nullptr : &ctx.in[2 + k0];
    const Tensor& out = ctx.out[k0];
    const Tensor& rstd = ctx.out[(kRms ? 1 : 2) + k0];
    const int64_t C = x.size(-1), rows = rstd.numel();
    if (rows == 0) return;
    DispatchNormTypes(op, x.dtype(), add ? add->dtype() : x.dtype(), out.dtype(), [&](auto tt, auto yt, auto ot) {
        using T = typename decltype(tt)::type;
        using Y = typename decltype(yt)::type;
        using O = typename decltype(ot)::type;
        using S = Acc<T>;
        const T* b = bias ? bias->data<T>() : nullptr;
        const Y* a = add ? add->data<Y>() : nullptr;
        T* sum = add ? ctx.out[0].data<T>() : nullptr;
        S* mean = kRms ? nullptr : ctx.out[1 + k0].data<S>();
        NativeStream_t s = NativeStream(ctx);
        const unsigned blocks = Blocks(rows, kThreads / kGroup);
        auto group = [&](auto per) {
            NormForwardGroupKernel<kRms, decltype(per)::value, T, Y, O><<<blocks, kThreads, 0, s>>>(
                x.data<T>(), a, sum, w.data<T>(), b, out.data<O>(), mean, rstd.data<S>(), rows, C, ctx.f(0));
        };
        if (!DispatchPerLane(C, group)) {
            NormForwardKernel<kRms, T, Y, O><<<Blocks(rows, 1), RowBlockThreads(C), 0, s>>>(
                x.data<T>(), a, sum, w.data<T>(), b, out.data<O>(), mean, rstd.data<S>(), rows, C, ctx.f(0));
        }
    });
    GPU_CHECK_LAUNCH(op);
}

// in: grad, x, weight, [mean,] rstd, [residual (kAdd, optional)]; out: dx, dweight, [dbias].
template <bool kRms, bool kAdd>
void NormBackward(KernelContext& ctx, const char* op) {
    const Tensor &g = ctx.in[0], &x = ctx.in[1], &w = ctx.in[2];
    const Tensor* mean = kRms ? nullptr : &ctx.in[3];
    const size_t nstat = kRms ? 1 : 2;
    const Tensor& rstd = ctx.in[2 + nstat];
    const Tensor* res = kAdd && ctx.in.size() > 3 + nstat ? &ctx.in[3 + nstat] : nullptr;
    const Tensor &dx = ctx.out[0], &dw = ctx.out[1];
    const Tensor* db = kRms ? nullptr : &ctx.out[2];
    const int64_t C = x.size(-1), rows = rstd.numel();
    NativeStream_t s = NativeStream(ctx);
    DispatchNormTypes(op, x.dtype(), g.dtype(), g.dtype(), [&](auto tt, auto gt, auto) {
        using T = typename decltype(tt)::type;
        using G = typename decltype(gt)::type;
        using S = Acc<T>;
        const S* mp = mean ? mean->data<S>() : nullptr;
        const T* rp = res ? res->data<T>() : nullptr;
        const int64_t W = kRms ? C : 2 * C;
        if constexpr (!std::is_same<T, double>::value) {  // float64's per-group sums would not fit shared memory
            if (rows > 0 && C > 0 && C <= 32 * kGroup) {
                // One pass for dx and the parameter gradients, on a grid fixed by the shape (so is the order of the
                // sums): up to 384 blocks where three fit an SM (kNormSumsShared; 396 on an H200), else 256.
                const int64_t groups = kThreads / kGroup;
                int64_t blocks = 0;
                Tensor partial;
                const bool fused = DispatchPerLane(C, [&](auto per) {
                    constexpr int kPer = decltype(per)::value;
                    const int64_t cap = kNormSumsShared<S, kPer, true> ? 384 : 256;
                    blocks = std::min<int64_t>(cap, (rows + groups - 1) / groups);
                    partial = Scratch(ctx, {blocks * W}, DataType::kFloat64);
                    NormBackwardGroupKernel<kRms, kPer, T, G, true><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
                        g.data<G>(), x.data<T>(), w.data<T>(), mp, rstd.data<S>(), rp, dx.data<T>(),
                        partial.data<double>(), rows, C);
                });
                if (!fused)
                    throw std::logic_error(std::string(op) + ": no group kernel for rows of " + std::to_string(C));
                GPU_CHECK_LAUNCH(op);
                NormParamsCombineKernel<T><<<static_cast<unsigned>((W + 31) / 32), dim3(32, 32), 0, s>>>(
                    partial.data<double>(), dw.data<T>(), db ? db->data<T>() : nullptr, C, W, blocks);
                GPU_CHECK_LAUNCH(op);
                return;
            }
        }
        if (rows > 0 && C > 0) {
            bool grouped = false;
            if constexpr (std::is_same<T, double>::value) {  // the others take the pass above for these rows
                grouped = DispatchPerLane(C, [&](auto per) {
                    NormBackwardGroupKernel<kRms, decltype(per)::value, T, G, false>
                        <<<Blocks(rows, kThreads / kGroup), kThreads, 0, s>>>(g.data<G>(), x.data<T>(), w.data<T>(), mp,
                                                                              rstd.data<S>(), rp, dx.data<T>(), nullptr,
                                                                              rows, C);
                });
            }
            if (!grouped) {
                NormBackwardDxKernel<kRms, T, G><<<Blocks(rows, 1), RowBlockThreads(C), 0, s>>>(
                    g.data<G>(), x.data<T>(), w.data<T>(), mp, rstd.data<S>(), rp, dx.data<T>(), rows, C);
            }
            GPU_CHECK_LAUNCH(op);
        }
        if (C == 0) return;
        // Enough (column, row chunk) threads to fill the device, chunks of at least 32 rows; fixed for a shape.
        const int64_t P = std::max<int64_t>(1, std::min((262144 + C - 1) / C, (rows + 31) / 32));
        const int64_t chunk = std::max<int64_t>(1, (rows + P - 1) / P);
        Tensor partial = Scratch(ctx, {P * W}, DataType::kFloat64);
        NormBackwardParamsKernel<kRms, T, G><<<Blocks(P * C), kThreads, 0, s>>>(
            g.data<G>(), x.data<T>(), mp, rstd.data<S>(), partial.data<double>(), rows, C, P, chunk);
        GPU_CHECK_LAUNCH(op);
        NormParamsCombineKernel<T><<<static_cast<unsigned>((W + 31) / 32), dim3(32, 32), 0, s>>>(
            partial.data<double>(), dw.data<T>(), db ? db->data<T>() : nullptr, C, W, P);
        GPU_CHECK_LAUNCH(op);
    });
}

void LayerNorm(KernelContext& ctx) { NormForward<false, false>(ctx, "layernorm"); }
void RmsNorm(KernelContext& ctx) { NormForward<true, false>(ctx, "rmsnorm"); }
void LayerNormBackward(KernelContext& ctx) { NormBackward<false, false>(ctx, "layernorm_backward"); }
void RmsNormBackward(KernelContext& ctx) { NormBackward<true, false>(ctx, "rmsnorm_backward"); }
void AddLayerNorm(KernelContext& ctx) { NormForward<false, true>(ctx, "add_layernorm"); }
void AddRmsNorm(KernelContext& ctx) { NormForward<true, true>(ctx, "add_rmsnorm"); }
void AddLayerNormBackward(KernelContext& ctx) { NormBackward<false, true>(ctx, "add_layernorm_backward"); }
void AddRmsNormBackward(KernelContext& ctx) { NormBackward<true, true>(ctx, "add_rmsnorm_backward"); }

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "softmax", Softmax);
REGISTER_PROVIDER_KERNEL(kProviderName, "log_softmax", LogSoftmax);
REGISTER_PROVIDER_KERNEL(kProviderName, "softmax_backward", SoftmaxBackwardOp);
REGISTER_PROVIDER_KERNEL(kProviderName, "log_softmax_backward", LogSoftmaxBackward);
REGISTER_PROVIDER_KERNEL(kProviderName, "layernorm", LayerNorm);
REGISTER_PROVIDER_KERNEL(kProviderName, "rmsnorm", RmsNorm);
REGISTER_PROVIDER_KERNEL(kProviderName, "layernorm_backward", LayerNormBackward);
REGISTER_PROVIDER_KERNEL(kProviderName, "rmsnorm_backward", RmsNormBackward);
REGISTER_PROVIDER_KERNEL(kProviderName, "add_layernorm", AddLayerNorm);
REGISTER_PROVIDER_KERNEL(kProviderName, "add_rmsnorm", AddRmsNorm);
REGISTER_PROVIDER_KERNEL(kProviderName, "add_layernorm_backward", AddLayerNormBackward);
REGISTER_PROVIDER_KERNEL(kProviderName, "add_rmsnorm_backward", AddRmsNormBackward);

}  // namespace infinitrain::gpu
