// Op adapters for rope, sdpa, sdpa_backward and sdpa_bthd(_backward) (kernels in attention.cuh and
// flash_attention.cuh, GEMMs in gemm.cuh).
#include <algorithm>
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

// The GEMM path's query blocks (attention.cuh): all T queries at once, or causal blocks of kSdpaQueryBlock.
struct SdpaBlocks {
    int64_t tb, count;
};

int64_t QueryBlock() {
    static const int64_t tb = [] {
        const char* e = std::getenv("INFINITRAIN_GPU_SDPA_BLOCK");
        if (!e || !*e) return kSdpaQueryBlock;
        char* end = nullptr;
        const long long v = std::strtoll(e, &end, 10);
        if (*end || v < 16 || v > (1 << 20)) {
            throw std::invalid_argument(std::string("INFINITRAIN_GPU_SDPA_BLOCK='") + e +
                                        "': expected a query count from 16 to 1048576");
        }
        return static_cast<int64_t>(v);
    }();
    return tb;
}

SdpaBlocks PlanBlocks(const SdpaDims& d, bool causal) {
    const int64_t tb = QueryBlock();
    if (!causal || d.T <= tb) return {d.T, 1};
    return {tb, (d.T + tb - 1) / tb};
}

// Block j: queries [t0, t0 + tb) against keys [0, keys). One block takes all g query heads of a kv head in one
// GEMM ([g*T, D] rows); causal blocks take one head per GEMM (calls of them). Its scores are [B * Hkv, g, tb,
// keys]; call c's part starts at sc_off(c) with a batch stride of sc_stride, its query rows at q_off(c).
struct SdpaBlock {
    int64_t t0, tb, keys, heads, calls;
    const SdpaDims* d;
    int64_t m() const { return heads * tb; }
    int64_t rows() const { return d->B * d->Hq * tb; }
    int64_t q_off(int64_t c) const { return (c * d->T + t0) * d->D; }
    int64_t sc_off(int64_t c) const { return c * tb * keys; }
    int64_t sc_stride() const { return d->g * tb * keys; }
    QueryRows query_rows() const { return {tb, t0, d->T}; }
};

SdpaBlock BlockOf(const SdpaDims& d, const SdpaBlocks& plan, int64_t j) {
    const int64_t t0 = j * plan.tb, tb = std::min(plan.tb, d.T - t0);
    const bool whole = plan.count == 1;
    return {t0, tb, whole ? d.S : t0 + tb, whole ? d.g : 1, whole ? 1 : d.g, &d};
}

// Launches a row kernel over `rows` rows of length n: a 32-lane group per row up to 1024, else a block.
template <typename C, typename O>
void LaunchSdpaSoftmax(NativeStream_t s, C* scores, O* probs, C* lse, int64_t rows, int64_t S, QueryRows qr,
                       bool causal) {
    if (rows == 0) return;
    if (S <= 1024) {
        SdpaSoftmaxKernel<false, C, O>
            <<<Blocks(rows, kThreads / kGroup), kThreads, 0, s>>>(scores, probs, lse, rows, S, qr, causal);
    } else {
        SdpaSoftmaxKernel<true, C, O>
            <<<Blocks(rows, 1), RowBlockThreads(S), 0, s>>>(scores, probs, lse, rows, S, qr, causal);
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
    const int64_t batch = d.B * d.Hkv, sq = d.g * d.T * d.D, skv = d.S * d.D;
    if (d.B * d.Hq * d.T == 0) return;  // no queries: nothing to write
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
    const SdpaBlocks plan = PlanBlocks(d, causal);
    const int64_t scratch = d.B * d.Hq * plan.tb * d.S;  // the largest block's scores
    Tensor scores_t = Scratch(ctx, {scratch}, ct);
    Tensor probs_t = k16 ? Scratch(ctx, {scratch}, q.dtype()) : scores_t;
    C* scores = scores_t.data<C>();
    T* probs = static_cast<T*>(probs_t.data());
    for (int64_t j = 0; j < plan.count; ++j) {
        const SdpaBlock b = BlockOf(d, plan, j);
        // scores [tb, keys] = scale * Q [tb, D] @ K [keys, D]^T, per call.
        for (int64_t c = 0; c < b.calls; ++c) {
            RowMajorGemm<T, C>(op, h, s, false, true, b.m(), b.keys, d.D, scale, q.data<T>() + b.q_off(c), sq,
                               k.data<T>(), skv, 0.0, scores + b.sc_off(c), b.sc_stride(), batch);
        }
        LaunchSdpaSoftmax<C, T>(s, scores, probs, lse.data<C>(), b.rows(), b.keys, b.query_rows(), causal);
        GPU_CHECK_LAUNCH(op);
        // out [tb, D] = P [tb, keys] @ V [keys, D]
        for (int64_t c = 0; c < b.calls; ++c) {
            RowMajorGemm<T, T>(op, h, s, false, false, b.m(), d.D, b.keys, 1.0, probs + b.sc_off(c), b.sc_stride(),
                               v.data<T>(), skv, 0.0, out.data<T>() + b.q_off(c), sq, batch);
        }
    }
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
    const int64_t rows = d.B * d.Hq * d.T, batch = d.B * d.Hkv;
    const int64_t sq = d.g * d.T * d.D, skv = d.S * d.D;  // batch strides
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
    const SdpaBlocks plan = PlanBlocks(d, causal);
    const int64_t scratch = d.B * d.Hq * plan.tb * d.S;
    Tensor sc_t = Scratch(ctx, {scratch}, ct), dp_t = Scratch(ctx, {scratch}, ct);
    Tensor p16_t = k16 ? Scratch(ctx, {scratch}, q.dtype()) : sc_t;
    Tensor ds16_t = k16 ? Scratch(ctx, {scratch}, q.dtype()) : dp_t;
    C *sc = sc_t.data<C>(), *dP = dp_t.data<C>();
    // P overwrites the scores and dS overwrites dP (float32/float64), else 16-bit copies.
    T* P = static_cast<T*>(p16_t.data());
    T* dS = static_cast<T*>(ds16_t.data());
    const T *qd = q.data<T>(), *kd = k.data<T>(), *vd = v.data<T>(), *gd = g.data<T>();
    // The last block first: its products into dK and dV cover every key, so it writes them and the others add.
    for (int64_t j = plan.count - 1; j >= 0; --j) {
        const SdpaBlock b = BlockOf(d, plan, j);
        const int64_t ss = b.sc_stride();
        // scores = scale * Q K^T; dP = dO V^T.
        for (int64_t c = 0; c < b.calls; ++c) {
            RowMajorGemm<T, C>(op, h, s, false, true, b.m(), b.keys, d.D, scale, qd + b.q_off(c), sq, kd, skv, 0.0,
                               sc + b.sc_off(c), ss, batch);
            RowMajorGemm<T, C>(op, h, s, false, true, b.m(), b.keys, d.D, 1.0, gd + b.q_off(c), sq, vd, skv, 0.0,
                               dP + b.sc_off(c), ss, batch);
        }
        if (b.rows() > 0 && b.keys <= 1024) {
            SdpaProbsDsKernel<false, T, C, T><<<Blocks(b.rows(), kThreads / kGroup), kThreads, 0, s>>>(
                sc, dP, P, dS, lse.data<C>(), gd, o.data<T>(), b.rows(), b.keys, d.D, b.query_rows(), causal);
        } else if (b.rows() > 0) {
            SdpaProbsDsKernel<true, T, C, T><<<Blocks(b.rows(), 1), RowBlockThreads(std::max(b.keys, d.D)), 0, s>>>(
                sc, dP, P, dS, lse.data<C>(), gd, o.data<T>(), b.rows(), b.keys, d.D, b.query_rows(), causal);
        }
        GPU_CHECK_LAUNCH(op);
        // dV [keys, D] += P^T [keys, tb] @ dO [tb, D]; dQ [tb, D] = scale * dS [tb, keys] @ K [keys, D];
        // dK [keys, D] += scale * dS^T [keys, tb] @ Q [tb, D].
        for (int64_t c = 0; c < b.calls; ++c) {
            const double beta = (j == plan.count - 1 && c == 0) ? 0.0 : 1.0;
            RowMajorGemm<T, T>(op, h, s, true, false, b.keys, d.D, b.m(), 1.0, P + b.sc_off(c), ss, gd + b.q_off(c), sq,
                               beta, dv.data<T>(), skv, batch);
            RowMajorGemm<T, T>(op, h, s, false, false, b.m(), d.D, b.keys, scale, dS + b.sc_off(c), ss, kd, skv, 0.0,
                               dq.data<T>() + b.q_off(c), sq, batch);
            RowMajorGemm<T, T>(op, h, s, true, false, b.keys, d.D, b.m(), scale, dS + b.sc_off(c), ss, qd + b.q_off(c),
                               sq, beta, dk.data<T>(), skv, batch);
        }
    }
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
