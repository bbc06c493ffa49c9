// Op adapter for adamw_ (kernel in optim.cuh).
#include "backends/gpu/context.h"
#include "backends/gpu/optim.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void AdamW(KernelContext& ctx) {
    const Tensor &param = ctx.in[0], &grad = ctx.in[1], &m = ctx.in[2], &v = ctx.in[3];
    const AdamWParams h = AdamWParamsOf(ctx);
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
