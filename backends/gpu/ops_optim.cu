// Op adapter for adamw_ (kernel in optim.cuh).
#include <cmath>

#include "backends/gpu/context.h"
#include "backends/gpu/optim.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void AdamW(KernelContext& ctx) {
    const Tensor &param = ctx.in[0], &grad = ctx.in[1], &m = ctx.in[2], &v = ctx.in[3];
    const double lr = ctx.f(0), b1 = ctx.f(1), b2 = ctx.f(2), eps = ctx.f(3), wd = ctx.f(4);
    const double step = static_cast<double>(ctx.i(5));
    const AdamWParams h{lr, b1, b2, eps, 1.0 - lr * wd, 1.0 - std::pow(b1, step), 1.0 - std::pow(b2, step)};
    const int64_t n = param.numel();
    if (n == 0) return;
    DispatchFloat(param.dtype(), "adamw_", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using S = Acc<T>;
        AdamWKernel<T><<<Blocks(n), kThreads, 0, NativeStream(ctx)>>>(param.data<T>(), grad.data<T>(), m.data<S>(),
                                                                      v.data<S>(), n, h);
    });
    GPU_CHECK_LAUNCH("adamw_");
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "adamw_", AdamW);

}  // namespace infinitrain::gpu
