// Op adapters for sum, mean, amax, argmax and sum_squares (kernels in reduce.cuh).
#include <limits>
#include <vector>

#include "backends/gpu/context.h"
#include "backends/gpu/copy.cuh"
#include "backends/gpu/reduce.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

struct Group {
    int64_t size;
    bool reduced;
};

// Drops size-1 dims and merges neighbours of the same kind (sizes >= 1).
std::vector<Group> Coalesce(const Shape& s, const std::vector<bool>& reduce) {
    std::vector<Group> g;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == 1) continue;
        if (!g.empty() && g.back().reduced == reduce[i]) {
            g.back().size *= s[i];
        } else {
            g.push_back({s[i], static_cast<bool>(reduce[i])});
        }
    }
    return g;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One (outer, R, inner) pass of x (type In) into out (outer * inner doubles).
template <RedKind K, typename In>
void ReducePass(const KernelContext& ctx, const In* x, double* out, int64_t outer, int64_t R, int64_t inner,
                std::vector<Tensor>& keep, const char* op) {
    NativeStream_t s = NativeStream(ctx);
    const int64_t nout = outer * inner;
    int64_t P = 1;
    double* dst = out;
    if (inner == 1 && R <= 4096) {
        const int per_block = kThreads / kGroup;
        RowGroupReduceKernel<K, In><<<Blocks(outer, per_block), kThreads, 0, s>>>(x, out, outer, R);
        GPU_CHECK_LAUNCH(op);
        return;
    }
    if (inner == 1) {
        P = std::min(std::max<int64_t>(CeilDiv(512, outer), 1), CeilDiv(R, 4096));
    } else {
        P = std::min(std::max<int64_t>(CeilDiv(131072, nout), 1), CeilDiv(R, 128));
    }
    const int64_t chunk = CeilDiv(R, P);
    if (P > 1) {
        keep.push_back(Scratch(ctx, {P * nout}, DataType::kFloat64));
        dst = keep.back().data<double>();
    }
    if (inner == 1) {
        RowBlockReduceKernel<K, In><<<Blocks(outer * P, 1), kThreads, 0, s>>>(x, dst, outer, R, P, chunk);
    } else {
        ColReduceKernel<K, In><<<Blocks(P * nout), kThreads, 0, s>>>(x, dst, outer, R, inner, P, chunk);
    }
    GPU_CHECK_LAUNCH(op);
    if (P > 1) {
        CombineKernel<K><<<Blocks(nout), kThreads, 0, s>>>(dst, out, nout, P);
        GPU_CHECK_LAUNCH(op);
    }
}

template <RedKind K>
void ReduceDims(KernelContext& ctx, bool mean, const char* op) {
    const Tensor &x = ctx.in[0], &y = ctx.out[0];
    const auto& dims = ctx.ints(0);
    const int64_t nd = x.dim();
    std::vector<bool> reduce(nd, dims.empty());
    for (int64_t d : dims) reduce[NormalizeDim(op, d, nd)] = true;
    int64_t count = 1;  // elements folded into each output
    for (int64_t i = 0; i < nd; ++i) {
        if (reduce[i]) count *= x.shape()[i];
    }
    const int64_t nout = y.numel();
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(x.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (nout == 0) return;
        if (x.numel() == 0) {  // the sum of nothing is 0, the mean 0/0 = NaN (amax is rejected by the meta)
            LaunchFill(y.data(), y.dtype(), nout, mean ? std::numeric_limits<double>::quiet_NaN() : 0.0, s, op);
            return;
        }
        std::vector<Group> g = Coalesce(x.shape(), reduce);
        std::vector<Tensor> keep;  // scratch, alive until every launch is enqueued
        const double* cur = nullptr;
        while (true) {
            int64_t last = -1;
            for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
                if (g[i].reduced) last = i;
            }
            if (last < 0) break;
            int64_t outer = 1, inner = 1;
            for (int64_t i = 0; i < last; ++i) outer *= g[i].size;
            for (size_t i = last + 1; i < g.size(); ++i) inner *= g[i].size;
            keep.push_back(Scratch(ctx, {outer * inner}, DataType::kFloat64));
            double* next = keep.back().data<double>();
            if (!cur) {
                ReducePass<K, T>(ctx, x.data<T>(), next, outer, g[last].size, inner, keep, op);
            } else {
                ReducePass<K, double>(ctx, cur, next, outer, g[last].size, inner, keep, op);
            }
            cur = next;
            // Remove the group and merge the kept neighbours it separated.
            g.erase(g.begin() + last);
            if (last > 0 && last < static_cast<int64_t>(g.size()) && !g[last - 1].reduced && !g[last].reduced) {
                g[last - 1].size *= g[last].size;
                g.erase(g.begin() + last);
            }
        }
        if (!cur) {  // only size-1 dims reduced: a copy
            MemcpyDeviceAsync(y.data(), x.data(), x.nbytes(), s);
            return;
        }
        FinalizeKernel<T>
            <<<Blocks(nout), kThreads, 0, s>>>(cur, y.data<T>(), nout, 1.0 / static_cast<double>(count), mean);
        GPU_CHECK_LAUNCH(op);
    });
}

void Sum(KernelContext& ctx) { ReduceDims<RedKind::kSum>(ctx, false, "sum"); }
void Mean(KernelContext& ctx) { ReduceDims<RedKind::kSum>(ctx, true, "mean"); }
void Amax(KernelContext& ctx) { ReduceDims<RedKind::kMax>(ctx, false, "amax"); }

void Argmax(KernelContext& ctx) {
    const Tensor& x = ctx.in[0];
    const Tensor& y = ctx.out[0];
    const int64_t d = NormalizeDim("argmax", ctx.i(0), x.dim());
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i) outer *= x.shape()[i];
    for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.shape()[i];
    const int64_t R = x.shape()[d];
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(x.dtype(), "argmax", [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (y.numel() == 0) return;
        if (inner > 1) {
            ArgmaxColKernel<T>
                <<<Blocks(outer * inner), kThreads, 0, s>>>(x.data<T>(), y.data<int64_t>(), outer, R, inner);
        } else if (R <= 4096) {
            ArgmaxRowKernel<T, false>
                <<<Blocks(outer, kThreads / kGroup), kThreads, 0, s>>>(x.data<T>(), y.data<int64_t>(), outer, R);
        } else {
            ArgmaxRowKernel<T, true><<<Blocks(outer, 1), kThreads, 0, s>>>(x.data<T>(), y.data<int64_t>(), outer, R);
        }
    });
    GPU_CHECK_LAUNCH("argmax");
}

void SumSquares(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &y = ctx.out[0];
    const int64_t n = x.numel();
    NativeStream_t s = NativeStream(ctx);
    // A fixed block count for a given n keeps the summation order, hence the result, reproducible.
    const int64_t blocks = n == 0 ? 0 : std::min<int64_t>(CeilDiv(n, 8 * kThreads), 1024);
    Tensor partial = Scratch(ctx, {std::max<int64_t>(blocks, 1)}, DataType::kFloat64);
    DispatchFloat(x.dtype(), "sum_squares", [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (blocks > 0) {
            SumSquaresPartialKernel<T>
                <<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(x.data<T>(), n, partial.data<double>());
            GPU_CHECK_LAUNCH("sum_squares");
        }
        LaunchSumPartials(s, partial.data<double>(), blocks, y);
        GPU_CHECK_LAUNCH("sum_squares");
    });
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "sum", Sum);
REGISTER_PROVIDER_KERNEL(kProviderName, "mean", Mean);
REGISTER_PROVIDER_KERNEL(kProviderName, "amax", Amax);
REGISTER_PROVIDER_KERNEL(kProviderName, "argmax", Argmax);
REGISTER_PROVIDER_KERNEL(kProviderName, "sum_squares", SumSquares);

}  // namespace infinitrain::gpu
