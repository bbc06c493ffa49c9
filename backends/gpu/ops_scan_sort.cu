// Op adapters for cumsum (scan.cuh) and sort (sort.cuh).
#include <algorithm>

#include "backends/gpu/context.h"
#include "backends/gpu/scan.cuh"
#include "backends/gpu/sort.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void Cumsum(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &y = ctx.out[0];
    const int64_t dim = NormalizeDim("cumsum", ctx.i(0), x.dim());
    const int64_t n = x.dim() ? x.size(dim) : 1;
    int64_t inner = 1;
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const int64_t outer = n * inner ? x.numel() / (n * inner) : 0;
    DispatchFloat(x.dtype(), "cumsum", [&](auto tag) {
        using T = typename decltype(tag)::type;
        LaunchCumsum(x.data<T>(), y.data<T>(), outer, n, inner, ctx.i(1) != 0, NativeStream(ctx), "cumsum");
    });
}

void Sort(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &values = ctx.out[0], &indices = ctx.out[1];
    const int64_t n = x.size(-1);
    const int64_t rows = n ? x.numel() / n : 0;
    if (rows == 0) return;
    if (n >= (int64_t{1} << 30)) OpError("sort", "rows longer than 2^30 elements are not supported on this device");
    int m = 1;
    while (m < n) m <<= 1;
    const int threads = std::max(32, std::min(1024, m / 2));
    DispatchFloat(x.dtype(), "sort", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using K = Acc<T>;
        const int64_t bytes = static_cast<int64_t>(m) * (sizeof(K) + sizeof(int));
        NativeStream_t s = NativeStream(ctx);
        if (bytes <= kSortSharedBytes) {
            SortRowsKernel<T>
                <<<Blocks(rows, 1), threads, bytes, s>>>(x.data<T>(), values.data<T>(), indices.data<int64_t>(), rows,
                                                         static_cast<int>(n), m, ctx.i(0) != 0, nullptr, nullptr);
        } else {
            const int64_t grid = std::min<int64_t>(rows, 1024);  // scratch of m pairs for each of these blocks
            Tensor keys = Scratch(ctx, {grid * m}, sizeof(K) == 8 ? DataType::kFloat64 : DataType::kFloat32);
            Tensor pos = Scratch(ctx, {grid * m}, DataType::kInt32);
            SortRowsKernel<T><<<static_cast<unsigned>(grid), threads, 0, s>>>(
                x.data<T>(), values.data<T>(), indices.data<int64_t>(), rows, static_cast<int>(n), m, ctx.i(0) != 0,
                keys.data<K>(), pos.data<int>());
        }
        GPU_CHECK_LAUNCH("sort");
    });
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "cumsum", Cumsum);
REGISTER_PROVIDER_KERNEL(kProviderName, "sort", Sort);

}  // namespace infinitrain::gpu
