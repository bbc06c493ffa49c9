// Op adapters for cross_entropy and cross_entropy_backward (kernels in loss.cuh).
#include <algorithm>
#include <type_traits>

#include "backends/gpu/context.h"
#include "backends/gpu/loss.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void CrossEntropy(KernelContext& ctx) {
    const Tensor &logits = ctx.in[0], &target = ctx.in[1];
    const Tensor &loss = ctx.out[0], &lse = ctx.out[1];
    const int64_t ignore = ctx.i(0), N = logits.size(0), V = logits.size(1);
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(logits.dtype(), "cross_entropy", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using S = Acc<T>;
        Tensor rows = Scratch(ctx, {2 * std::max<int64_t>(N, 1)}, DataType::kFloat64);
        double* row_loss = rows.data<double>();
        double* row_kept = row_loss + std::max<int64_t>(N, 1);
        if (N > 0) {
            auto rows_kernel = [&](auto vec) {
                constexpr int kVec = decltype(vec)::value;
                CrossEntropyRowsKernel<T, kVec><<<Blocks(N, 1), RowBlockThreads(V / kVec), 0, s>>>(
                    logits.data<T>(), target.data<int64_t>(), lse.data<S>(), row_loss, row_kept, N, V, ignore,
                    DeviceErrorSlot(ctx));
            };
            constexpr int kVec = 16 / sizeof(T);
            if (V % kVec == 0 && Aligned(logits.data(), 16)) {
                rows_kernel(std::integral_constant<int, kVec>{});
            } else {
                rows_kernel(std::integral_constant<int, 1>{});
            }
            GPU_CHECK_LAUNCH("cross_entropy");
        }
        CrossEntropyLossKernel<S><<<1, 1024, 0, s>>>(row_loss, row_kept, N, loss.data<S>());
        GPU_CHECK_LAUNCH("cross_entropy");
    });
}

void CrossEntropyBackward(KernelContext& ctx) {
    const char* op = "cross_entropy_backward";
    const Tensor &logits = ctx.in[0], &target = ctx.in[1], &lse = ctx.in[2], &grad = ctx.in[3];
    const Tensor& dx = ctx.out[0];
    const int64_t ignore = ctx.i(0), N = logits.size(0), V = logits.size(1);
    if (grad.numel() != 1) OpError(op, "grad must hold one value, got shape " + ShapeToString(grad.shape()));
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(logits.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using S = Acc<T>;
        Tensor coef = Scratch(ctx, {1}, DataType::kFloat64);
        CrossEntropyCoefKernel<S><<<1, 1024, 0, s>>>(target.data<int64_t>(), grad.data<S>(), N, V, ignore,
                                                     coef.data<double>(), DeviceErrorSlot(ctx));
        GPU_CHECK_LAUNCH(op);
        if (N * V == 0) return;
        auto backward = [&](auto vec) {
            constexpr int kVec = decltype(vec)::value;
            CrossEntropyBackwardKernel<T, kVec>
                <<<Blocks(N, 1), kThreads, 0, s>>>(logits.data<T>(), target.data<int64_t>(), lse.data<S>(),
                                                   coef.data<double>(), dx.data<T>(), N, V, ignore);
        };
        constexpr int kVec = 16 / sizeof(T);
        if (V % kVec == 0 && Aligned(logits.data(), 16) && Aligned(dx.data(), 16)) {
            backward(std::integral_constant<int, kVec>{});
        } else {
            backward(std::integral_constant<int, 1>{});
        }
        GPU_CHECK_LAUNCH(op);
    });
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "cross_entropy", CrossEntropy);
REGISTER_PROVIDER_KERNEL(kProviderName, "cross_entropy_backward", CrossEntropyBackward);

}  // namespace infinitrain::gpu
