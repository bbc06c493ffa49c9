// Op adapters for rope, sdpa, sdpa_backward and sdpa_bthd(_backward) (kernels in attention.cuh and
// flash_attention.cuh, GEMMs in gemm.cuh).
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "backends/gpu/attention.cuh"
#include "backends/gpu/attention.h"
#include "backends/gpu/context.h"
#include "backends/gpu/copy.cuh"
#include "backends/gpu/flash_attention.cuh"
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

// Which kernels run sdpa: the flash kernels (flash_attention.cuh) where they apply, else the GEMM path below.
// INFINITRAIN_GPU_ATTENTION=flash|gemm forces one (flash still falls back for shapes it does not take); the
// default takes flash for float32 and, where the vendor has a TileMma, for 16-bit types: without tensor cores
// the 16-bit GEMM path (the vendor BLAS's) is faster than the SIMT flash kernels.
enum class AttentionPath { kAuto, kFlash, kGemm };

AttentionPath ForcedPath() {
    static const AttentionPath path = [] {
        const char* e = std::getenv("INFINITRAIN_GPU_ATTENTION");
        if (!e || !*e || std::strcmp(e, "auto") == 0) return AttentionPath::kAuto;
        if (std::strcmp(e, "flash") == 0) return AttentionPath::kFlash;
        if (std::strcmp(e, "gemm") == 0) return AttentionPath::kGemm;
        throw std::invalid_argument(std::string("INFINITRAIN_GPU_ATTENTION='") + e +
                                    "': expected 'auto' (the default), 'flash' or 'gemm'");
    }();
    return path;
}

template <typename T>
bool UseFlash() {
    switch (ForcedPath()) {
        case AttentionPath::kFlash:
            return true;
        case AttentionPath::kGemm:
            return false;
        default:
            return std::is_same<T, float>::value || kHasTileMma;
    }
}

struct SdpaDims {
    int64_t B, Hq, Hkv, T, S, D, g;
};

SdpaDims GetDims(const Tensor& q, const Tensor& k) {
    return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), q.size(1) / k.size(1)};
}

// Launches a row kernel over `rows` rows of length n: a 32-lane group per row up to 1024, else a block.
template <typename C, typename O>
void LaunchSdpaSoftmax(NativeStream_t s, C* scores, O* probs, C* lse, int64_t rows, int64_t T_len, int64_t S,
                       bool causal) {
    if (rows == 0) return;
    if (S <= 1024) {
        SdpaSoftmaxKernel<false, C, O>
            <<<Blocks(rows, kThreads / kGroup), kThreads, 0, s>>>(scores, probs, lse, rows, T_len, S, causal);
    } else {
        SdpaSoftmaxKernel<true, C, O>
            <<<Blocks(rows, 1), RowBlockThreads(S), 0, s>>>(scores, probs, lse, rows, T_len, S, causal);
    }
}

// The GEMM path. Operands stay in their storage type T (16-bit ones on the vendor BLAS's tensor cores); scores
// and the softmax are in C = Acc<T>; P and dS take part in products in T: 16-bit copies when T is 16-bit (k16),
// else the scores' own buffers.
template <typename T>
void SdpaForward(KernelContext& ctx) {
    using C = Acc<T>;
    constexpr bool k16 = !std::is_same<T, C>::value;
    const char* op = ctx.op ? ctx.op->name() : "sdpa";  // sdpa_bthd runs this on a sub-context
    const Tensor &q = ctx.in[0], &k = ctx.in[1], &v = ctx.in[2];
    const Tensor &out = ctx.out[0], &lse = ctx.out[1];
    const bool causal = ctx.i(0) != 0;
    const double scale = ctx.f(1);
    const SdpaDims d = GetDims(q, k);
    const int64_t rows = d.B * d.Hq * d.T, gT = d.g * d.T, batch = d.B * d.Hkv;
    if (rows == 0) return;  // no queries: nothing to write
    NativeStream_t s = NativeStream(ctx);
    if constexpr (!std::is_same<T, double>::value) {
        if (UseFlash<T>() &&
            LaunchFlashForward<T>(q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(), lse.data<float>(), d.B, d.Hq,
                                  d.Hkv, d.T, d.S, d.D, causal, scale, s, op)) {
            return;
        }
    }
    BlasHandle h = Blas(ctx);
    const DataType ct = std::is_same<C, double>::value ? DataType::kFloat64 : DataType::kFloat32;
    Tensor scores_t = Scratch(ctx, {rows * d.S}, ct);
    Tensor probs_t = k16 ? Scratch(ctx, {rows * d.S}, q.dtype()) : scores_t;
    C* scores = scores_t.data<C>();
    T* probs = static_cast<T*>(probs_t.data());
    // scores[bg] [g*T, S] = scale * Q[bg] [g*T, D] @ K[bg] [S, D]^T
    RowMajorGemm<T, C>(op, h, s, false, true, gT, d.S, d.D, scale, q.data<T>(), gT * d.D, k.data<T>(), d.S * d.D, 0.0,
                       scores, gT * d.S, batch);
    LaunchSdpaSoftmax<C, T>(s, scores, probs, lse.data<C>(), rows, d.T, d.S, causal);
    GPU_CHECK_LAUNCH(op);
    // out[bg] [g*T, D] = P [g*T, S] @ V [S, D]
    RowMajorGemm<T, T>(op, h, s, false, false, gT, d.D, d.S, 1.0, probs, gT * d.S, v.data<T>(), d.S * d.D, 0.0,
                       out.data<T>(), gT * d.D, batch);
}

template <typename T>
void SdpaBackward(KernelContext& ctx) {
    using C = Acc<T>;
    constexpr bool k16 = !std::is_same<T, C>::value;
    const char* op = ctx.op ? ctx.op->name() : "sdpa_backward";
    const Tensor &g = ctx.in[0], &q = ctx.in[1], &k = ctx.in[2], &v = ctx.in[3], &o = ctx.in[4], &lse = ctx.in[5];
    const Tensor &dq = ctx.out[0], &dk = ctx.out[1], &dv = ctx.out[2];
    const bool causal = ctx.i(0) != 0;
    const double scale = ctx.f(1);
    const SdpaDims d = GetDims(q, k);
    const int64_t rows = d.B * d.Hq * d.T, gT = d.g * d.T, batch = d.B * d.Hkv;
    const int64_t sq = gT * d.D, skv = d.S * d.D, ss = gT * d.S;  // batch strides
    NativeStream_t s = NativeStream(ctx);
    if constexpr (!std::is_same<T, double>::value) {
        if (UseFlash<T>()) {
            Tensor rowdot = Scratch(ctx, {std::max<int64_t>(rows, 1)}, DataType::kFloat32);  // rowsum(dO * out)
            if (LaunchFlashBackward<T>(g.data<T>(), q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(),
                                       lse.data<float>(), dq.data<T>(), dk.data<T>(), dv.data<T>(),
                                       rowdot.data<float>(), d.B, d.Hq, d.Hkv, d.T, d.S, d.D, causal, scale, s, op)) {
                return;
            }
        }
    }
    BlasHandle h = Blas(ctx);
    const DataType ct = std::is_same<C, double>::value ? DataType::kFloat64 : DataType::kFloat32;
    Tensor p_t = Scratch(ctx, {rows * d.S}, ct), dp_t = Scratch(ctx, {rows * d.S}, ct);
    Tensor p16_t = k16 ? Scratch(ctx, {rows * d.S}, q.dtype()) : p_t;
    C *P = p_t.data<C>(), *dP = dp_t.data<C>();
    T* p16 = static_cast<T*>(p16_t.data());
    // dS overwrites dP (float32/float64), or the 16-bit P copy once dV has read it (same stream).
    T* dS = k16 ? p16 : reinterpret_cast<T*>(dP);
    const T *qd = q.data<T>(), *kd = k.data<T>(), *vd = v.data<T>(), *gd = g.data<T>();
    // P = exp(scale * Q K^T - lse), masked keys 0.
    RowMajorGemm<T, C>(op, h, s, false, true, gT, d.S, d.D, scale, qd, sq, kd, skv, 0.0, P, ss, batch);
    if (rows * d.S > 0) {
        SdpaProbsKernel<C, T>
            <<<Blocks(rows * d.S), kThreads, 0, s>>>(P, k16 ? p16 : nullptr, lse.data<C>(), rows, d.T, d.S, causal);
        GPU_CHECK_LAUNCH(op);
    }
    // dV [S, D] = P^T [S, g*T] @ dO [g*T, D]; dP [g*T, S] = dO [g*T, D] @ V^T.
    RowMajorGemm<T, T>(op, h, s, true, false, d.S, d.D, gT, 1.0, p16, ss, gd, sq, 0.0, dv.data<T>(), skv, batch);
    RowMajorGemm<T, C>(op, h, s, false, true, gT, d.S, d.D, 1.0, gd, sq, vd, skv, 0.0, dP, ss, batch);
    // dS = P * (dP - rowsum(dO * out)).
    if (rows > 0) {
        SdpaDsKernel<T, C, T><<<Blocks(rows, 1), RowBlockThreads(std::max(d.S, d.D)), 0, s>>>(
            P, dP, dS, gd, o.data<T>(), rows, d.S, d.D);
        GPU_CHECK_LAUNCH(op);
    }
    // dQ [g*T, D] = scale * dS [g*T, S] @ K [S, D]; dK [S, D] = scale * dS^T [S, g*T] @ Q [g*T, D].
    RowMajorGemm<T, T>(op, h, s, false, false, gT, d.D, d.S, scale, dS, ss, kd, skv, 0.0, dq.data<T>(), sq, batch);
    RowMajorGemm<T, T>(op, h, s, true, false, d.S, d.D, gT, scale, dS, ss, qd, sq, 0.0, dk.data<T>(), skv, batch);
}

// x [B, I, J, D] with dims 1 and 2 swapped, by permute's kernel, into y [B, J, I, D] (new scratch when y is null).
Tensor SwapMiddle(const KernelContext& ctx, const Tensor& x, const Tensor* y = nullptr) {
    const Shape& s = x.shape();
    std::vector<Tensor> out = {y ? *y : Scratch(ctx, {s[0], s[2], s[1], s[3]}, x.dtype())};
    RunKernelOf("permute", ctx, {x}, out, {std::vector<int64_t>{0, 2, 1, 3}});
    return out[0];
}

}  // namespace

void PortableSdpa(KernelContext& ctx) {
    DispatchFloat(ctx.in[0].dtype(), "sdpa", [&](auto tag) { SdpaForward<typename decltype(tag)::type>(ctx); });
}

void PortableSdpaBackward(KernelContext& ctx) {
    DispatchFloat(ctx.in[1].dtype(), "sdpa_backward",
                  [&](auto tag) { SdpaBackward<typename decltype(tag)::type>(ctx); });
}

// sdpa_bthd: sdpa on [B, H, T, D] copies (a provider with a kernel that reads [B, T, H, D] overrides these).
void PortableSdpaBthd(KernelContext& ctx) {
    std::vector<Tensor> in = {SwapMiddle(ctx, ctx.in[0]), SwapMiddle(ctx, ctx.in[1]), SwapMiddle(ctx, ctx.in[2])};
    std::vector<Tensor> out = {Scratch(ctx, in[0].shape(), in[0].dtype()), ctx.out[1]};
    KernelContext sub{in, out, ctx.attrs, ctx.device, ctx.stream, ctx.op};
    PortableSdpa(sub);
    SwapMiddle(ctx, out[0], &ctx.out[0]);
}

void PortableSdpaBthdBackward(KernelContext& ctx) {
    std::vector<Tensor> in;
    for (int k = 0; k < 5; ++k) in.push_back(SwapMiddle(ctx, ctx.in[k]));
    in.push_back(ctx.in[5]);
    std::vector<Tensor> out;
    for (int k = 1; k < 4; ++k) out.push_back(Scratch(ctx, in[k].shape(), in[k].dtype()));
    KernelContext sub{in, out, ctx.attrs, ctx.device, ctx.stream, ctx.op};
    PortableSdpaBackward(sub);
    for (int k = 0; k < 3; ++k) SwapMiddle(ctx, out[k], &ctx.out[k]);
}

REGISTER_PROVIDER_KERNEL(kProviderName, "rope", Rope);
REGISTER_PROVIDER_KERNEL(kProviderName, "sdpa", PortableSdpa);
REGISTER_PROVIDER_KERNEL(kProviderName, "sdpa_backward", PortableSdpaBackward);
REGISTER_PROVIDER_KERNEL(kProviderName, "sdpa_bthd", PortableSdpaBthd);
REGISTER_PROVIDER_KERNEL(kProviderName, "sdpa_bthd_backward", PortableSdpaBthdBackward);

}  // namespace infinitrain::gpu
