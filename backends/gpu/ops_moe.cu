// Op adapters for moe_topk, moe_topk_backward, moe_permute, moe_unpermute and moe_unpermute_backward (kernels in
// moe.cuh).
#include <algorithm>
#include <limits>
#include <string>

#include "backends/gpu/context.h"
#include "backends/gpu/moe.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

constexpr int kRowsPerBlock = kThreads / kGroup;  // 32-lane groups per block of the row kernels

void MoeTopk(KernelContext& ctx) {
    const char* op = "moe_topk";
    const Tensor& logits = ctx.in[0];
    const Tensor &weights = ctx.out[0], &experts = ctx.out[1];
    const int64_t k = ctx.i(0), N = logits.size(0), E = logits.size(1);
    const bool normalize = ctx.i(1) != 0;
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(logits.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using S = Acc<T>;
        if (N * k == 0) return;
        // Taken flags: E bytes per group in shared memory (8 groups: 32 KiB at most), else a [N, E] scratch.
        const bool shared = E <= kMoeSharedExperts;
        Tensor taken = Scratch(ctx, {shared ? 1 : N * E}, DataType::kUInt8);
        const size_t smem = shared ? static_cast<size_t>(kRowsPerBlock * E) : 0;
        MoeTopkKernel<T><<<Blocks(N, kRowsPerBlock), kThreads, smem, s>>>(
            logits.data<T>(), weights.data<S>(), experts.data<int64_t>(), shared ? nullptr : taken.data<uint8_t>(), N,
            E, k, normalize);
        GPU_CHECK_LAUNCH(op);
    });
}

void MoeTopkBackward(KernelContext& ctx) {
    const char* op = "moe_topk_backward";
    const Tensor &logits = ctx.in[0], &experts = ctx.in[1], &grad = ctx.in[2];
    const Tensor& dlogits = ctx.out[0];
    const bool normalize = ctx.i(0) != 0;
    const int64_t N = logits.size(0), E = logits.size(1), k = experts.size(1);
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(logits.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using S = Acc<T>;
        if (N == 0) return;
        MoeTopkBackwardKernel<T>
            <<<Blocks(N, kRowsPerBlock), kThreads, 0, s>>>(logits.data<T>(), experts.data<int64_t>(), grad.data<S>(),
                                                           dlogits.data<T>(), N, E, k, normalize, DeviceErrorSlot(ctx));
        GPU_CHECK_LAUNCH(op);
    });
}

void MoePermute(KernelContext& ctx) {
    const char* op = "moe_permute";
    const Tensor &x = ctx.in[0], &experts = ctx.in[1];
    const Tensor &out = ctx.out[0], &source = ctx.out[1], &counts = ctx.out[2];
    const int64_t E = ctx.i(0), k = experts.size(1), S = experts.numel(), C = x.size(1);
    if (E > std::numeric_limits<int32_t>::max()) {
        OpError(op, "the " + std::string(kProviderName) + " kernel takes at most 2^31 - 1 experts, got " +
                        std::to_string(E));
    }
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(x.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (S == 0) {
            MemsetAsync(counts.data(), 0, counts.nbytes(), s);
            return;
        }
        const int64_t chunks = (S + kMoeChunk - 1) / kMoeChunk;
        Tensor scan = Scratch(ctx, {2 * E * chunks}, DataType::kInt64);
        int64_t* chunk_counts = scan.data<int64_t>();
        int64_t* offsets = chunk_counts + E * chunks;
        MoeCountKernel<<<Blocks(chunks, 1), kThreads, 0, s>>>(experts.data<int64_t>(), S, E, chunks, chunk_counts,
                                                              DeviceErrorSlot(ctx));
        GPU_CHECK_LAUNCH(op);
        MoeScanKernel<<<1, 1024, 0, s>>>(chunk_counts, E, chunks, offsets, counts.data<int64_t>());
        GPU_CHECK_LAUNCH(op);
        MemsetAsync(source.data(), 0xff, source.nbytes(), s);  // -1: slots a bad expert kept out
        MoePlaceKernel<<<Blocks(chunks, 1), kThreads, 0, s>>>(experts.data<int64_t>(), S, E, chunks, offsets,
                                                              source.data<int64_t>());
        GPU_CHECK_LAUNCH(op);
        if (C == 0) return;
        MoeGatherRowsKernel<T>
            <<<Blocks(S * C), kThreads, 0, s>>>(x.data<T>(), source.data<int64_t>(), out.data<T>(), S, C, k);
        GPU_CHECK_LAUNCH(op);
    });
}

// pos [S] int64: the inverse of source (-1 where no row names a slot); bad sources are recorded as `kind`.
Tensor InversePermutation(const KernelContext& ctx, const Tensor& source, IndexErrorKind kind) {
    const int64_t S = source.numel();
    NativeStream_t s = NativeStream(ctx);
    Tensor pos = Scratch(ctx, {S}, DataType::kInt64);
    Tensor mark = Scratch(ctx, {S}, DataType::kInt32);
    MemsetAsync(pos.data(), 0xff, pos.nbytes(), s);
    MemsetAsync(mark.data(), 0, mark.nbytes(), s);
    MoeInverseKernel<<<Blocks(S), kThreads, 0, s>>>(source.data<int64_t>(), S, static_cast<unsigned int*>(mark.data()),
                                                    pos.data<int64_t>(), kind, DeviceErrorSlot(ctx));
    return pos;  // mark returns to the allocator's cache after the launch is enqueued
}

void MoeUnpermute(KernelContext& ctx) {
    const char* op = "moe_unpermute";
    const Tensor &y = ctx.in[0], &source = ctx.in[1], &w = ctx.in[2];
    const Tensor& out = ctx.out[0];
    const int64_t N = w.size(0), k = w.size(1), C = y.size(1), S = source.numel();
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(y.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using S_ = Acc<T>;
        if (S == 0) return;
        Tensor pos = InversePermutation(ctx, source, IndexErrorKind::kMoeUnpermute);  // validates even when C == 0
        GPU_CHECK_LAUNCH(op);
        if (N * C == 0) return;
        MoeCombineKernel<T>
            <<<Blocks(N * C), kThreads, 0, s>>>(y.data<T>(), pos.data<int64_t>(), w.data<S_>(), out.data<T>(), N, C, k);
        GPU_CHECK_LAUNCH(op);
    });
}

void MoeUnpermuteBackward(KernelContext& ctx) {
    const char* op = "moe_unpermute_backward";
    const Tensor &grad = ctx.in[0], &y = ctx.in[1], &source = ctx.in[2], &w = ctx.in[3];
    const Tensor &dy = ctx.out[0], &dw = ctx.out[1];
    const int64_t k = w.size(1), C = y.size(1), S = source.numel();
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(y.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using S_ = Acc<T>;
        if (S == 0) return;
        Tensor pos = InversePermutation(ctx, source, IndexErrorKind::kMoeUnpermuteBackward);
        GPU_CHECK_LAUNCH(op);
        if (C > 0) {
            MoeCombineBackwardDyKernel<T><<<Blocks(S * C), kThreads, 0, s>>>(grad.data<T>(), source.data<int64_t>(),
                                                                             w.data<S_>(), dy.data<T>(), S, C, k);
            GPU_CHECK_LAUNCH(op);
        }
        MoeCombineBackwardDwKernel<T><<<Blocks(S, kRowsPerBlock), kThreads, 0, s>>>(
            grad.data<T>(), y.data<T>(), pos.data<int64_t>(), dw.data<S_>(), S, C, k);
        GPU_CHECK_LAUNCH(op);
    });
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "moe_topk", MoeTopk);
REGISTER_PROVIDER_KERNEL(kProviderName, "moe_topk_backward", MoeTopkBackward);
REGISTER_PROVIDER_KERNEL(kProviderName, "moe_permute", MoePermute);
REGISTER_PROVIDER_KERNEL(kProviderName, "moe_unpermute", MoeUnpermute);
REGISTER_PROVIDER_KERNEL(kProviderName, "moe_unpermute_backward", MoeUnpermuteBackward);

}  // namespace infinitrain::gpu
