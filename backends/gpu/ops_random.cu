// Op adapters for uniform_, normal_, dropout and dropout_backward (kernels in random.cuh).
#include <string>

#include "backends/gpu/context.h"
#include "backends/gpu/random.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

double DropoutScale(const char* op, double p) {
    if (!(p >= 0.0 && p < 1.0)) OpError(op, "p must be in [0, 1), got " + std::to_string(p));
    return 1.0 / (1.0 - p);
}

void Uniform(KernelContext& ctx) {
    const Tensor& x = ctx.in[0];
    const double low = ctx.f(0), high = ctx.f(1);
    const uint64_t key = StreamKey(static_cast<uint64_t>(ctx.i(2)), 0);
    const uint64_t offset = static_cast<uint64_t>(ctx.i(3));
    const int64_t n = x.numel();
    if (n == 0) return;
    DispatchFloat(x.dtype(), "uniform_", [&](auto tag) {
        using T = typename decltype(tag)::type;
        UniformKernel<T><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(x.data<T>(), n, key, offset, low, high - low);
    });
    GPU_CHECK_LAUNCH("uniform_");
}

void Normal(KernelContext& ctx) {
    const Tensor& x = ctx.in[0];
    const double mean = ctx.f(0), stddev = ctx.f(1);
    const uint64_t seed = static_cast<uint64_t>(ctx.i(2));
    const uint64_t offset = static_cast<uint64_t>(ctx.i(3));
    const int64_t n = x.numel();
    if (n == 0) return;
    DispatchFloat(x.dtype(), "normal_", [&](auto tag) {
        using T = typename decltype(tag)::type;
        NormalKernel<T><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(x.data<T>(), n, StreamKey(seed, 1),
                                                                       StreamKey(seed, 2), offset, mean, stddev);
    });
    GPU_CHECK_LAUNCH("normal_");
}

void Dropout(KernelContext& ctx) {
    const Tensor& x = ctx.in[0];
    const double p = ctx.f(0), scale = DropoutScale("dropout", p);
    const uint64_t key = StreamKey(static_cast<uint64_t>(ctx.i(1)), 0);
    const uint64_t offset = static_cast<uint64_t>(ctx.i(2));
    const int64_t n = x.numel();
    if (n == 0) return;
    DispatchFloat(x.dtype(), "dropout", [&](auto tag) {
        using T = typename decltype(tag)::type;
        DropoutKernel<T><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(
            x.data<T>(), ctx.out[0].data<T>(), ctx.out[1].data<uint8_t>(), n, key, offset, p, scale);
    });
    GPU_CHECK_LAUNCH("dropout");
}

void DropoutBackward(KernelContext& ctx) {
    const Tensor &g = ctx.in[0], &mask = ctx.in[1];
    const double scale = DropoutScale("dropout_backward", ctx.f(0));
    const int64_t n = g.numel();
    if (n == 0) return;
    DispatchFloat(g.dtype(), "dropout_backward", [&](auto tag) {
        using T = typename decltype(tag)::type;
        DropoutBackwardKernel<T><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(g.data<T>(), mask.data<uint8_t>(),
                                                                                ctx.out[0].data<T>(), n, scale);
    });
    GPU_CHECK_LAUNCH("dropout_backward");
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "uniform_", Uniform);
REGISTER_PROVIDER_KERNEL(kProviderName, "normal_", Normal);
REGISTER_PROVIDER_KERNEL(kProviderName, "dropout", Dropout);
REGISTER_PROVIDER_KERNEL(kProviderName, "dropout_backward", DropoutBackward);

}  // namespace infinitrain::gpu
