// Op adapters for the elementwise ops (kernels in elementwise.cuh).
#include "backends/gpu/context.h"
#include "backends/gpu/elementwise.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

template <typename F>
void Unary(KernelContext& ctx, const char* op, F make) {
    const Tensor &x = ctx.in[0], &y = ctx.out[0];
    DispatchFloat(x.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using Fn = decltype(make(Acc<T>{}));
        Map1(x.data<T>(), y.data<T>(), x.numel(), UnaryFn<T, Fn>{make(Acc<T>{})}, NativeStream(ctx), op);
    });
}

template <typename F>
void UnaryKernel(KernelContext& ctx, const char* op) {
    Unary(ctx, op, [](auto) { return F{}; });
}

#define GPU_UNARY(op, F) \
    void F##Kernel(KernelContext& ctx) { UnaryKernel<F>(ctx, op); }

void Affine(KernelContext& ctx) {
    const double scale = ctx.f(0), bias = ctx.f(1);
    Unary(ctx, "affine", [=](auto v) {
        using V = decltype(v);
        return AffineF<V>{static_cast<V>(scale), static_cast<V>(bias)};
    });
}

void PowScalar(KernelContext& ctx) {
    const double p = ctx.f(0);
    Unary(ctx, "pow_scalar", [=](auto v) {
        using V = decltype(v);
        return PowF<V>{static_cast<V>(p)};
    });
}

void Clamp(KernelContext& ctx) {
    const double lo = ctx.f(0), hi = ctx.f(1);
    Unary(ctx, "clamp", [=](auto v) {
        using V = decltype(v);
        return ClampF<V>{static_cast<V>(lo), static_cast<V>(hi)};
    });
}

// Same-shape (x or out, grad) -> dx, and the broadcasting binary ops.
template <typename F>
void Binary(KernelContext& ctx, const char* op) {
    const Tensor &a = ctx.in[0], &b = ctx.in[1], &y = ctx.out[0];
    DispatchFloat(a.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        LaunchBinary<T, T>(op, a, b, y, BinaryFn<T, F>{F{}}, NativeStream(ctx));
    });
}

template <typename F>
void Compare(KernelContext& ctx, const char* op) {
    const Tensor &a = ctx.in[0], &b = ctx.in[1], &y = ctx.out[0];
    auto run = [&](auto tag) {
        using T = typename decltype(tag)::type;
        LaunchBinary<T, uint8_t>(op, a, b, y, CompareFn<T, F>{F{}}, NativeStream(ctx));
    };
    switch (a.dtype()) {
        case DataType::kInt32:
            return run(Tag<int32_t>{});
        case DataType::kInt64:
            return run(Tag<int64_t>{});
        default:
            DispatchFloat(a.dtype(), op, run);
    }
}

#define GPU_BINARY(op, F) \
    void F##Kernel(KernelContext& ctx) { Binary<F>(ctx, op); }
#define GPU_COMPARE(op, F) \
    void F##Kernel(KernelContext& ctx) { Compare<F>(ctx, op); }

GPU_UNARY("neg", NegF)
GPU_UNARY("exp", ExpF)
GPU_UNARY("log", LogF)
GPU_UNARY("sqrt", SqrtF)
GPU_UNARY("rsqrt", RsqrtF)
GPU_UNARY("abs", AbsF)
GPU_UNARY("sin", SinF)
GPU_UNARY("cos", CosF)
GPU_UNARY("tanh", TanhF)
GPU_UNARY("sigmoid", SigmoidF)
GPU_UNARY("relu", ReluF)
GPU_UNARY("silu", SiluF)
GPU_UNARY("gelu_tanh", GeluTanhF)
GPU_UNARY("gelu", GeluF)
GPU_UNARY("erf", ErfF)
GPU_UNARY("log1p", Log1pF)
GPU_UNARY("expm1", Expm1F)
GPU_UNARY("floor", FloorF)
GPU_UNARY("ceil", CeilF)
GPU_UNARY("round", RoundF)
GPU_UNARY("trunc", TruncF)
GPU_UNARY("sign", SignF)
GPU_BINARY("tanh_backward", TanhBackwardF)
GPU_BINARY("sigmoid_backward", SigmoidBackwardF)
GPU_BINARY("relu_backward", ReluBackwardF)
GPU_BINARY("silu_backward", SiluBackwardF)
GPU_BINARY("gelu_tanh_backward", GeluTanhBackwardF)
GPU_BINARY("gelu_backward", GeluBackwardF)
GPU_BINARY("pow", PowBinF)
GPU_BINARY("fmod", FmodF)
GPU_BINARY("remainder", RemainderF)
GPU_BINARY("atan2", Atan2F)
GPU_BINARY("add", AddF)
GPU_BINARY("sub", SubF)
GPU_BINARY("mul", MulF)
GPU_BINARY("div", DivF)
GPU_BINARY("maximum", MaximumF)
GPU_BINARY("minimum", MinimumF)
GPU_BINARY("swiglu", SwigluF)
GPU_COMPARE("eq", EqF)
GPU_COMPARE("ne", NeF)
GPU_COMPARE("lt", LtF)
GPU_COMPARE("le", LeF)
GPU_COMPARE("gt", GtF)
GPU_COMPARE("ge", GeF)

void Where(KernelContext& ctx) {
    const Tensor &cond = ctx.in[0], &a = ctx.in[1], &b = ctx.in[2], &y = ctx.out[0];
    const int64_t n = y.numel();
    if (n == 0) return;
    Broadcast<3> plan = MakeBroadcast<3>("where", y.shape(), {&cond.shape(), &a.shape(), &b.shape()});
    DispatchBytes(a.dtype(), [&](auto tag) {
        using U = typename decltype(tag)::type;
        if (Fits32(plan, n)) {
            WhereKernel<U><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(
                Narrow32(plan), cond.data<uint8_t>(), a.data<U>(), b.data<U>(), y.data<U>(), static_cast<int32_t>(n));
        } else {
            WhereKernel<U><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(plan, cond.data<uint8_t>(), a.data<U>(),
                                                                          b.data<U>(), y.data<U>(), n);
        }
    });
    GPU_CHECK_LAUNCH("where");
}

void MaskedFill(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &mask = ctx.in[1], &y = ctx.out[0];
    const int64_t n = y.numel();
    if (n == 0) return;
    Broadcast<1> plan = MakeBroadcast<1>("masked_fill", y.shape(), {&mask.shape()});
    const double value = ctx.f(0);
    DispatchFloat(x.dtype(), "masked_fill", [&](auto tag) {
        using T = typename decltype(tag)::type;
        constexpr int kVec = 16 / sizeof(T);
        const int inner = plan.nd - 1;
        const int64_t mstep = plan.nd > 0 ? plan.stride[0][inner] : 0;
        if (plan.nd > 0 && plan.size[inner] % kVec == 0 && (mstep == 0 || mstep == 1) && Fits32(plan, n) &&
            Aligned(x.data(), 16) && Aligned(y.data(), 16)) {
            const int32_t packs = static_cast<int32_t>(n / kVec);
            MaskedFillPackKernel<T, kVec><<<Blocks(packs), kThreads, 0, NativeStream(ctx)>>>(
                Narrow32(plan), x.data<T>(), mask.data<uint8_t>(), y.data<T>(), packs, static_cast<int32_t>(mstep),
                value);
        } else if (Fits32(plan, n)) {
            MaskedFillKernel<T><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(
                Narrow32(plan), x.data<T>(), mask.data<uint8_t>(), y.data<T>(), static_cast<int32_t>(n), value);
        } else {
            MaskedFillKernel<T><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(plan, x.data<T>(), mask.data<uint8_t>(),
                                                                               y.data<T>(), n, value);
        }
    });
    GPU_CHECK_LAUNCH("masked_fill");
}

void Axpy(KernelContext& ctx) {
    const Tensor &y = ctx.in[0], &x = ctx.in[1];
    const double alpha = ctx.f(0);
    DispatchFloat(y.dtype(), "axpy_", [&](auto tag) {
        using T = typename decltype(tag)::type;
        Map2(y.data<T>(), x.data<T>(), y.data<T>(), y.numel(), AxpyFn<T>{static_cast<Acc<T>>(alpha)}, NativeStream(ctx),
             "axpy_");
    });
}

void SwigluBackward(KernelContext& ctx) {
    const Tensor &gate = ctx.in[0], &up = ctx.in[1], &grad = ctx.in[2];
    const int64_t n = gate.numel();
    if (n == 0) return;
    DispatchFloat(gate.dtype(), "swiglu_backward", [&](auto tag) {
        using T = typename decltype(tag)::type;
        SwigluBackwardKernel<T><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(
            gate.data<T>(), up.data<T>(), grad.data<T>(), ctx.out[0].data<T>(), ctx.out[1].data<T>(), n);
    });
    GPU_CHECK_LAUNCH("swiglu_backward");
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "neg", NegFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "exp", ExpFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "log", LogFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "sqrt", SqrtFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "rsqrt", RsqrtFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "abs", AbsFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "sin", SinFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "cos", CosFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "tanh", TanhFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "sigmoid", SigmoidFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "relu", ReluFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "silu", SiluFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "gelu_tanh", GeluTanhFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "gelu", GeluFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "erf", ErfFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "log1p", Log1pFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "expm1", Expm1FKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "floor", FloorFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "ceil", CeilFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "round", RoundFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "trunc", TruncFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "sign", SignFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "tanh_backward", TanhBackwardFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "sigmoid_backward", SigmoidBackwardFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "relu_backward", ReluBackwardFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "silu_backward", SiluBackwardFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "gelu_tanh_backward", GeluTanhBackwardFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "gelu_backward", GeluBackwardFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "pow", PowBinFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "fmod", FmodFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "remainder", RemainderFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "atan2", Atan2FKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "add", AddFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "sub", SubFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "mul", MulFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "div", DivFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "maximum", MaximumFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "minimum", MinimumFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "swiglu", SwigluFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "eq", EqFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "ne", NeFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "lt", LtFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "le", LeFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "gt", GtFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "ge", GeFKernel);
REGISTER_PROVIDER_KERNEL(kProviderName, "affine", Affine);
REGISTER_PROVIDER_KERNEL(kProviderName, "pow_scalar", PowScalar);
REGISTER_PROVIDER_KERNEL(kProviderName, "clamp", Clamp);
REGISTER_PROVIDER_KERNEL(kProviderName, "where", Where);
REGISTER_PROVIDER_KERNEL(kProviderName, "masked_fill", MaskedFill);
REGISTER_PROVIDER_KERNEL(kProviderName, "axpy_", Axpy);
REGISTER_PROVIDER_KERNEL(kProviderName, "swiglu_backward", SwigluBackward);

}  // namespace infinitrain::gpu
