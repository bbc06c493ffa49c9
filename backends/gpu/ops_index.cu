// Op adapters for embedding, embedding_backward, gather and scatter_add (kernels in index.cuh).
#include <algorithm>

#include "backends/gpu/context.h"
#include "backends/gpu/index.cuh"
#include "backends/gpu/map.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void Split3(const Shape& s, int64_t dim, int64_t* outer, int64_t* inner) {
    *outer = 1;
    *inner = 1;
    for (int64_t i = 0; i < dim; ++i) *outer *= s[i];
    for (size_t i = dim + 1; i < s.size(); ++i) *inner *= s[i];
}

template <typename U>
void LaunchEmbedding(const KernelContext& ctx, int64_t rows, int64_t row_bytes, int64_t V) {
    const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
    EmbeddingKernel<U><<<Blocks(rows * units), kThreads, 0, NativeStream(ctx)>>>(
        static_cast<const U*>(ctx.in[0].data()), ctx.in[1].data<int64_t>(), static_cast<U*>(ctx.out[0].data()), rows,
        units, V, DeviceErrorSlot(ctx));
}

void Embedding(KernelContext& ctx) {
    const Tensor &w = ctx.in[0], &index = ctx.in[1], &out = ctx.out[0];
    DispatchFloat(w.dtype(), "embedding", [](auto) {});
    const int64_t V = w.size(0), rows = index.numel();
    const int64_t row_bytes = w.size(1) * static_cast<int64_t>(DataTypeSize(w.dtype()));
    if (rows == 0) return;
    if (row_bytes == 0) {  // nothing to copy, but bad indices still raise (as on the CPU)
        CheckIndicesKernel<<<Blocks(rows), kThreads, 0, NativeStream(ctx)>>>(
            index.data<int64_t>(), rows, V, IndexErrorKind::kEmbedding, 0, DeviceErrorSlot(ctx));
        GPU_CHECK_LAUNCH("embedding");
        return;
    }
    // The widest unit that divides a row and aligns both tensors.
    auto fits = [&](int64_t u) { return row_bytes % u == 0 && Aligned(w.data(), u) && Aligned(out.data(), u); };
    if (fits(16)) {
        LaunchEmbedding<uint4>(ctx, rows, row_bytes, V);
    } else if (fits(8)) {
        LaunchEmbedding<uint64_t>(ctx, rows, row_bytes, V);
    } else if (fits(4)) {
        LaunchEmbedding<uint32_t>(ctx, rows, row_bytes, V);
    } else {
        LaunchEmbedding<uint16_t>(ctx, rows, row_bytes, V);
    }
    GPU_CHECK_LAUNCH("embedding");
}

void EmbeddingBackward(KernelContext& ctx) {
    const char* op = "embedding_backward";
    const Tensor &grad = ctx.in[0], &index = ctx.in[1], &dw = ctx.out[0];
    const int64_t V = dw.size(0), C = dw.size(1), N = index.numel();
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(grad.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        MemsetAsync(dw.data(), 0, dw.nbytes(), s);  // rows no index names
        if (N == 0) return;
        int64_t padded = kSortTile;
        while (padded < N) padded *= 2;
        Tensor keys_t = Scratch(ctx, {padded}, DataType::kInt64);
        uint64_t* keys = static_cast<uint64_t*>(keys_t.data());
        // Indices are checked even when C == 0, as the CPU does.
        EmbeddingKeysKernel<<<Blocks(padded), kThreads, 0, s>>>(index.data<int64_t>(), keys, N, padded, V,
                                                                DeviceErrorSlot(ctx));
        GPU_CHECK_LAUNCH(op);
        if (dw.numel() == 0) return;
        const unsigned tiles = static_cast<unsigned>(padded / kSortTile);
        BitonicTileKernel<<<tiles, 1024, 0, s>>>(keys, 2, kSortTile);
        GPU_CHECK_LAUNCH(op);
        for (int64_t k = 2 * kSortTile; k <= padded; k *= 2) {
            for (int64_t j = k / 2; j >= kSortTile; j /= 2) {
                BitonicGlobalKernel<<<Blocks(padded), kThreads, 0, s>>>(keys, padded, j, k);
            }
            BitonicTileKernel<<<tiles, 1024, 0, s>>>(keys, k, k);
            GPU_CHECK_LAUNCH(op);
        }
        const int threads = std::min(RowBlockThreads(4 * C), 256);
        EmbeddingRunsKernel<T><<<Blocks(N, 1), threads, 0, s>>>(keys, grad.data<T>(), dw.data<T>(), N, C);
        GPU_CHECK_LAUNCH(op);
    });
}

void Gather(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &index = ctx.in[1], &out = ctx.out[0];
    const int64_t d = NormalizeDim("gather", ctx.i(0), x.dim());
    int64_t outer, inner;
    Split3(x.shape(), d, &outer, &inner);
    const int64_t n = x.shape()[d], m = index.shape()[d], total = index.numel();
    if (total == 0) return;
    DispatchFloat(x.dtype(), "gather", [&](auto tag) {
        using T = typename decltype(tag)::type;
        GatherKernel<T><<<Blocks(total), kThreads, 0, NativeStream(ctx)>>>(
            x.data<T>(), index.data<int64_t>(), out.data<T>(), total, n, m, inner, d, DeviceErrorSlot(ctx));
    });
    GPU_CHECK_LAUNCH("gather");
}

void ScatterAdd(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &index = ctx.in[1], &src = ctx.in[2], &out = ctx.out[0];
    const int64_t d = NormalizeDim("scatter_add", ctx.i(0), x.dim());
    int64_t outer, inner;
    Split3(x.shape(), d, &outer, &inner);
    const int64_t n = x.shape()[d], m = index.shape()[d], total = index.numel();
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(x.dtype(), "scatter_add", [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (x.numel() == 0 && total == 0) return;
        Tensor buf = Scratch(ctx, {x.numel()}, DataType::kFloat64);
        if (x.numel() > 0) {
            ToDoubleKernel<T><<<Blocks(x.numel()), kThreads, 0, s>>>(x.data<T>(), buf.data<double>(), x.numel());
            GPU_CHECK_LAUNCH("scatter_add");
        }
        if (total > 0) {
            ScatterAddKernel<T><<<Blocks(total), kThreads, 0, s>>>(
                buf.data<double>(), index.data<int64_t>(), src.data<T>(), total, n, m, inner, d, DeviceErrorSlot(ctx));
            GPU_CHECK_LAUNCH("scatter_add");
        }
        if (x.numel() > 0) {
            FromDoubleKernel<T><<<Blocks(x.numel()), kThreads, 0, s>>>(buf.data<double>(), out.data<T>(), x.numel());
            GPU_CHECK_LAUNCH("scatter_add");
        }
    });
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "embedding", Embedding);
REGISTER_PROVIDER_KERNEL(kProviderName, "embedding_backward", EmbeddingBackward);
REGISTER_PROVIDER_KERNEL(kProviderName, "gather", Gather);
REGISTER_PROVIDER_KERNEL(kProviderName, "scatter_add", ScatterAdd);

}  // namespace infinitrain::gpu
