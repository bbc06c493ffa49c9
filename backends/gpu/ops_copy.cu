// Op adapters for cast, copy_ and fill_ (kernels in copy.cuh).
#include "backends/gpu/context.h"
#include "backends/gpu/copy.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {

void LaunchConvert(const void* src, DataType st, void* dst, DataType dt, int64_t n, NativeStream_t s, const char* op) {
    if (n <= 0) return;
    if (st == dt) {
        MemcpyDeviceAsync(dst, src, static_cast<size_t>(n) * DataTypeSize(st), s);
        return;
    }
    DispatchAll(st, [&](auto sc) {
        DispatchAll(dt, [&](auto dc) {
            constexpr DataType S = decltype(sc)::value, D = decltype(dc)::value;
            Map1(static_cast<const Storage<S>*>(src), static_cast<Storage<D>*>(dst), n, ConvertOp<S, D>{}, s, op);
        });
    });
}

void LaunchFill(void* y, DataType t, int64_t n, double value, NativeStream_t s, const char* op) {
    if (n <= 0) return;
    if (value == 0.0 && !std::signbit(value)) {  // +0 is all-zero bytes in every dtype
        MemsetAsync(y, 0, static_cast<size_t>(n) * DataTypeSize(t), s);
        return;
    }
    DispatchAll(t, [&](auto tc) {
        constexpr DataType D = decltype(tc)::value;
        FillKernel<D><<<Blocks(n), kThreads, 0, s>>>(static_cast<Storage<D>*>(y), n, value);
        GPU_CHECK_LAUNCH(op);
    });
}

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
