// Op adapters for rope, sdpa and sdpa_backward (kernels in attention.cuh, GEMMs in gemm.cuh).
#include <type_traits>

#include "backends/gpu/attention.cuh"
#include "backends/gpu/attention.h"
#include "backends/gpu/context.h"
#include "backends/gpu/copy.cuh"
#include "backends/gpu/gemm.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void Rope(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &cos_t = ctx.in[1], &sin_t = ctx.in[2];
    const double sign = ctx.i(0) ? -1.0 : 1.0;
    const int64_t T_len = x.size(1), H = x.size(2), half = x.size(3) / 2;
    const int64_t pairs = x.numel() / 2;
    if (pairs == 0) return;
    DispatchFloat(x.dtype(), "rope", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using S = Acc<T>;
        RopeKernel<T><<<Blocks(pairs), kThreads, 0, NativeStream(ctx)>>>(
            x.data<T>(), cos_t.data<S>(), sin_t.data<S>(), ctx.out[0].data<T>(), pairs, T_len, H, half, sign);
    });
    GPU_CHECK_LAUNCH("rope");
}

struct SdpaDims {
    int64_t B, Hq, Hkv, T, S, D, g;
};

SdpaDims GetDims(const Tensor& q, const Tensor& k) {
    return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), q.size(1) / k.size(1)};
}

// A tensor in the compute type C: its own memory when T is C, else a widened copy kept alive in `keep`.
template <typename T, typename C>
const C* AsCompute(const KernelContext& ctx, const Tensor& t, std::vector<Tensor>& keep, const char* op) {
    if constexpr (std::is_same<T, C>::value) {
        return t.data<C>();
    } else {
        keep.push_back(Scratch(ctx, t.shape(), DataType::kFloat32));
        LaunchConvert(t.data(), t.dtype(), keep.back().data(), DataType::kFloat32, t.numel(), NativeStream(ctx), op);
        return keep.back().data<C>();
    }
}

// Where a result of type C goes: the output itself when T is C, else float32 scratch narrowed by Narrow().
template <typename T, typename C>
C* ResultBuffer(const KernelContext& ctx, const Tensor& out, std::vector<Tensor>& keep) {
    if constexpr (std::is_same<T, C>::value) {
        return out.data<C>();
    } else {
        keep.push_back(Scratch(ctx, out.shape(), DataType::kFloat32));
        return keep.back().data<C>();
    }
}

template <typename T, typename C>
void Narrow(const KernelContext& ctx, const C* buf, const Tensor& out, const char* op) {
    if constexpr (!std::is_same<T, C>::value) {
        LaunchConvert(buf, DataType::kFloat32, out.data(), out.dtype(), out.numel(), NativeStream(ctx), op);
    }
}

// Launches a row kernel over `rows` rows of length n: a 32-lane group per row up to 1024, else a block.
template <typename C>
void LaunchSdpaSoftmax(NativeStream_t s, C* scores, C* lse, int64_t rows, int64_t T_len, int64_t S, bool causal) {
    if (rows == 0) return;
    if (S <= 1024) {
        SdpaSoftmaxKernel<false, C>
            <<<Blocks(rows, kThreads / kGroup), kThreads, 0, s>>>(scores, lse, rows, T_len, S, causal);
    } else {
        SdpaSoftmaxKernel<true, C><<<Blocks(rows, 1), RowBlockThreads(S), 0, s>>>(scores, lse, rows, T_len, S, causal);
    }
}

template <typename T>
void SdpaForward(KernelContext& ctx) {
    using C = Acc<T>;
    const char* op = "sdpa";
    const Tensor &q = ctx.in[0], &k = ctx.in[1], &v = ctx.in[2];
    const Tensor &out = ctx.out[0], &lse = ctx.out[1];
    const bool causal = ctx.i(0) != 0;
    const double scale = ctx.f(1);
    const SdpaDims d = GetDims(q, k);
    const int64_t rows = d.B * d.Hq * d.T, gT = d.g * d.T, batch = d.B * d.Hkv;
    if (rows == 0) return;  // no queries: nothing to write
    NativeStream_t s = NativeStream(ctx);
    BlasHandle h = Blas(ctx);
    std::vector<Tensor> keep;
    const C* qc = AsCompute<T, C>(ctx, q, keep, op);
    const C* kc = AsCompute<T, C>(ctx, k, keep, op);
    const C* vc = AsCompute<T, C>(ctx, v, keep, op);
    Tensor scores_t =
        Scratch(ctx, {rows * d.S}, q.dtype() == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32);
    C* scores = scores_t.data<C>();
    // scores[bg] [g*T, S] = scale * Q[bg] [g*T, D] @ K[bg] [S, D]^T
    RowMajorGemm<C, C>(op, h, s, false, true, gT, d.S, d.D, scale, qc, gT * d.D, kc, d.S * d.D, 0.0, scores, gT * d.S,
                       batch);
    LaunchSdpaSoftmax<C>(s, scores, lse.data<C>(), rows, d.T, d.S, causal);
    GPU_CHECK_LAUNCH(op);
    // out[bg] [g*T, D] = P [g*T, S] @ V [S, D]
    C* oc = ResultBuffer<T, C>(ctx, out, keep);
    RowMajorGemm<C, C>(op, h, s, false, false, gT, d.D, d.S, 1.0, scores, gT * d.S, vc, d.S * d.D, 0.0, oc, gT * d.D,
                       batch);
    Narrow<T, C>(ctx, oc, out, op);
}

template <typename T>
void SdpaBackward(KernelContext& ctx) {
    using C = Acc<T>;
    const char* op = "sdpa_backward";
    const Tensor &g = ctx.in[0], &q = ctx.in[1], &k = ctx.in[2], &v = ctx.in[3], &o = ctx.in[4], &lse = ctx.in[5];
    const Tensor &dq = ctx.out[0], &dk = ctx.out[1], &dv = ctx.out[2];
    const bool causal = ctx.i(0) != 0;
    const double scale = ctx.f(1);
    const SdpaDims d = GetDims(q, k);
    const int64_t rows = d.B * d.Hq * d.T, gT = d.g * d.T, batch = d.B * d.Hkv;
    const int64_t sq = gT * d.D, skv = d.S * d.D, ss = gT * d.S;  // batch strides
    NativeStream_t s = NativeStream(ctx);
    BlasHandle h = Blas(ctx);
    std::vector<Tensor> keep;
    const C* qc = AsCompute<T, C>(ctx, q, keep, op);
    const C* kc = AsCompute<T, C>(ctx, k, keep, op);
    const C* vc = AsCompute<T, C>(ctx, v, keep, op);
    const C* gc = AsCompute<T, C>(ctx, g, keep, op);
    const DataType ct = q.dtype() == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32;
    Tensor p_t = Scratch(ctx, {rows * d.S}, ct), dp_t = Scratch(ctx, {rows * d.S}, ct);
    C *P = p_t.data<C>(), *dP = dp_t.data<C>();
    C* dqc = ResultBuffer<T, C>(ctx, dq, keep);
    C* dkc = ResultBuffer<T, C>(ctx, dk, keep);
    C* dvc = ResultBuffer<T, C>(ctx, dv, keep);
    // P = exp(scale * Q K^T - lse), masked keys 0.
    RowMajorGemm<C, C>(op, h, s, false, true, gT, d.S, d.D, scale, qc, sq, kc, skv, 0.0, P, ss, batch);
    if (rows * d.S > 0) {
        SdpaProbsKernel<C><<<Blocks(rows * d.S), kThreads, 0, s>>>(P, lse.data<C>(), rows, d.T, d.S, causal);
        GPU_CHECK_LAUNCH(op);
    }
    // dV [S, D] = P^T [S, g*T] @ dO [g*T, D]; dP [g*T, S] = dO [g*T, D] @ V^T.
    RowMajorGemm<C, C>(op, h, s, true, false, d.S, d.D, gT, 1.0, P, ss, gc, sq, 0.0, dvc, skv, batch);
    RowMajorGemm<C, C>(op, h, s, false, true, gT, d.S, d.D, 1.0, gc, sq, vc, skv, 0.0, dP, ss, batch);
    // dS = P * (dP - rowsum(dO * out)), in place in dP.
    if (rows > 0) {
        SdpaDsKernel<T, C><<<Blocks(rows, 1), RowBlockThreads(std::max(d.S, d.D)), 0, s>>>(P, dP, g.data<T>(),
                                                                                           o.data<T>(), rows, d.S, d.D);
        GPU_CHECK_LAUNCH(op);
    }
    // dQ [g*T, D] = scale * dS [g*T, S] @ K [S, D]; dK [S, D] = scale * dS^T [S, g*T] @ Q [g*T, D].
    RowMajorGemm<C, C>(op, h, s, false, false, gT, d.D, d.S, scale, dP, ss, kc, skv, 0.0, dqc, sq, batch);
    RowMajorGemm<C, C>(op, h, s, true, false, d.S, d.D, gT, scale, dP, ss, qc, sq, 0.0, dkc, skv, batch);
    Narrow<T, C>(ctx, dqc, dq, op);
    Narrow<T, C>(ctx, dkc, dk, op);
    Narrow<T, C>(ctx, dvc, dv, op);
}

}  // namespace

void PortableSdpa(KernelContext& ctx) {
    DispatchFloat(ctx.in[0].dtype(), "sdpa", [&](auto tag) { SdpaForward<typename decltype(tag)::type>(ctx); });
}

void PortableSdpaBackward(KernelContext& ctx) {
    DispatchFloat(ctx.in[1].dtype(), "sdpa_backward",
                  [&](auto tag) { SdpaBackward<typename decltype(tag)::type>(ctx); });
}

REGISTER_PROVIDER_KERNEL(kProviderName, "rope", Rope);
REGISTER_PROVIDER_KERNEL(kProviderName, "sdpa", PortableSdpa);
REGISTER_PROVIDER_KERNEL(kProviderName, "sdpa_backward", PortableSdpaBackward);

}  // namespace infinitrain::gpu
