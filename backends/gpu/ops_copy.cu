// Op adapters for cast, copy_ and fill_ (kernels in copy.cuh).
#include "backends/gpu/context.h"
#include "backends/gpu/copy.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void Cast(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &y = ctx.out[0];
    LaunchConvert(x.data(), x.dtype(), y.data(), y.dtype(), x.numel(), NativeStream(ctx), "cast");
}

void Copy(KernelContext& ctx) {
    const Tensor &dst = ctx.in[0], &src = ctx.in[1];
    LaunchConvert(src.data(), src.dtype(), dst.data(), dst.dtype(), dst.numel(), NativeStream(ctx), "copy_");
}

void Fill(KernelContext& ctx) {
    const Tensor& x = ctx.in[0];
    LaunchFill(x.data(), x.dtype(), x.numel(), ctx.f(0), NativeStream(ctx), "fill_");
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "cast", Cast);
REGISTER_PROVIDER_KERNEL(kProviderName, "copy_", Copy);
REGISTER_PROVIDER_KERNEL(kProviderName, "fill_", Fill);

}  // namespace infinitrain::gpu
