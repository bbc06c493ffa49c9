// Op adapters for foreach_sum_squares, foreach_mul_ and foreach_adamw_ (kernels in foreach.cuh).
#include <array>
#include <vector>

#include "backends/gpu/context.h"
#include "backends/gpu/foreach.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void ForeachSumSquares(KernelContext& ctx) {
    const Tensor& y = ctx.out[0];
    std::vector<std::array<void*, 1>> ptrs;
    std::vector<int64_t> n;
    for (const Tensor& x : ctx.in) {
        ptrs.push_back({x.data()});
        n.push_back(x.numel());
    }
    const int64_t blocks = ForeachBlocks(n);
    Tensor partial = Scratch(ctx, {std::max<int64_t>(blocks, 1)}, DataType::kFloat64);
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(ctx.in[0].dtype(), "foreach_sum_squares", [&](auto tag) {
        using T = typename decltype(tag)::type;
        ForEachBatch<1, 64>(ptrs, n, {sizeof(T)}, [&](const ForeachBatch1& batch, int64_t nblocks, int64_t base) {
            ForeachSumSquaresKernel<T>
                <<<static_cast<unsigned>(nblocks), kThreads, 0, s>>>(batch, partial.data<double>(), base);
            GPU_CHECK_LAUNCH("foreach_sum_squares");
        });
    });
    LaunchSumPartials(s, partial.data<double>(), blocks, y);
    GPU_CHECK_LAUNCH("foreach_sum_squares");
}

void ForeachMul(KernelContext& ctx) {
    const Tensor& scale = ctx.in[0];
    std::vector<std::array<void*, 1>> ptrs;
    std::vector<int64_t> n;
    for (size_t k = 1; k < ctx.in.size(); ++k) {
        ptrs.push_back({ctx.in[k].data()});
        n.push_back(ctx.in[k].numel());
    }
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(ctx.in[1].dtype(), "foreach_mul_", [&](auto tag) {
        using T = typename decltype(tag)::type;
        DispatchFloat(scale.dtype(), "foreach_mul_", [&](auto scale_tag) {
            using S = typename decltype(scale_tag)::type;
            ForEachBatch<1, 64>(ptrs, n, {sizeof(T)}, [&](const ForeachBatch1& batch, int64_t nblocks, int64_t) {
                ForeachMulKernel<T, S><<<static_cast<unsigned>(nblocks), kThreads, 0, s>>>(batch, scale.data<S>());
                GPU_CHECK_LAUNCH("foreach_mul_");
            });
        });
    });
}

void ForeachAdamW(KernelContext& ctx) {
    const AdamWParams h = AdamWParamsOf(ctx);
    const size_t sets = ctx.in.size() / 4;
    std::vector<std::array<void*, 4>> ptrs;
    std::vector<int64_t> n;
    for (size_t k = 0; k < sets; ++k) {
        ptrs.push_back(
            {ctx.in[k].data(), ctx.in[sets + k].data(), ctx.in[2 * sets + k].data(), ctx.in[3 * sets + k].data()});
        n.push_back(ctx.in[k].numel());
    }
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(ctx.in[0].dtype(), "foreach_adamw_", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using S = Acc<T>;
        const std::array<int64_t, 4> bytes{sizeof(T), sizeof(T), sizeof(S), sizeof(S)};
        ForEachBatch<4, 32>(ptrs, n, bytes, [&](const ForeachBatch4& batch, int64_t nblocks, int64_t) {
            ForeachAdamWKernel<T><<<static_cast<unsigned>(nblocks), kThreads, 0, s>>>(batch, h);
            GPU_CHECK_LAUNCH("foreach_adamw_");
        });
    });
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "foreach_sum_squares", ForeachSumSquares);
REGISTER_PROVIDER_KERNEL(kProviderName, "foreach_mul_", ForeachMul);
REGISTER_PROVIDER_KERNEL(kProviderName, "foreach_adamw_", ForeachAdamW);

}  // namespace infinitrain::gpu
