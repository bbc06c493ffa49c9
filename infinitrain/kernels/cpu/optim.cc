// Optimizer steps, elementwise and in place over flat tensors.
//   adamw_(param, grad, m, v; lr, beta1, beta2, eps, weight_decay, step), PyTorch's AdamW:
//     param -= lr * weight_decay * param
//     m = beta1 * m + (1 - beta1) * grad;  v = beta2 * v + (1 - beta2) * grad^2
//     param -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
//   m and v are float32 (float64 for float64 params). The arithmetic is in double; bfloat16 params are loaded to
//   float and rounded on store.
//   foreach_adamw_ runs the same per-element code over several (param, grad, m, v) sets.
#include <cmath>
#include <vector>

#include "infinitrain/kernels/cpu/common.h"
#include "infinitrain/kernels/cpu/fastmath.h"

namespace infinitrain::cpu {
namespace {

struct AdamWConsts {
    double lr, b1, b2, eps, bc1, bc2, decay;
};

// Elements [b, e): the update in double, as the GPU kernel computes it (same operations, so the same roundings
// in every clone: the products and sums are not contracted, -ffp-contract=off).
template <typename T, typename S>
INFINITRAIN_SIMD_CLONES __attribute__((optimize("fp-contract=off"))) void AdamWRange(T* p, const T* g, S* m, S* v,
                                                                                     int64_t b, int64_t e,
                                                                                     const AdamWConsts& c) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
        double gi = Load(g + i);
        double mi = c.b1 * m[i] + (1.0 - c.b1) * gi;
        double vi = c.b2 * v[i] + (1.0 - c.b2) * gi * gi;
        m[i] = static_cast<S>(mi);
        v[i] = static_cast<S>(vi);
        double pi = Load(p + i) * c.decay;
        pi -= c.lr * (mi / c.bc1) / (std::sqrt(vi / c.bc2) + c.eps);
        Store(p + i, static_cast<S>(pi));
    }
}

AdamWConsts Consts(const KernelContext& ctx) {
    AdamWConsts c{ctx.f(0), ctx.f(1), ctx.f(2), ctx.f(3), 0.0, 0.0, 0.0};
    double step = static_cast<double>(ctx.i(5));
    c.bc1 = 1.0 - std::pow(c.b1, step);
    c.bc2 = 1.0 - std::pow(c.b2, step);
    c.decay = 1.0 - c.lr * ctx.f(4);
    return c;
}

void AdamWKernel(KernelContext& ctx) {
    const Tensor &param = ctx.in[0], &grad = ctx.in[1], &m_t = ctx.in[2], &v_t = ctx.in[3];
    const AdamWConsts c = Consts(ctx);
    DispatchFloat(param.dtype(), "adamw_", [&](auto tag) {
        using T = decltype(tag);
        using S = Acc<T>;
        T* p = param.data<T>();
        const T* g = grad.data<T>();
        S *m = m_t.data<S>(), *v = v_t.data<S>();
        ParallelFor(param.numel(), 16, [&](int64_t b, int64_t e) { AdamWRange<T, S>(p, g, m, v, b, e, c); });
    });
}

// foreach_adamw_: AdamWRange over pieces of every set (tensors: n params, n grads, n m, n v), so each element gets
// adamw_'s arithmetic exactly.
void ForeachAdamWKernel(KernelContext& ctx) {
    const AdamWConsts c = Consts(ctx);
    const size_t n = ctx.in.size() / 4;
    const std::vector<ForeachPiece> pieces = ForeachPieces(ctx.in, 0, n, 1 << 14);
    DispatchFloat(ctx.in[0].dtype(), "foreach_adamw_", [&](auto tag) {
        using T = decltype(tag);
        using S = Acc<T>;
        std::vector<T*> p(n), g(n);
        std::vector<S*> m(n), v(n);
        for (size_t k = 0; k < n; ++k) {
            p[k] = ctx.in[k].data<T>();
            g[k] = ctx.in[n + k].data<T>();
            m[k] = ctx.in[2 * n + k].data<S>();
            v[k] = ctx.in[3 * n + k].data<S>();
        }
        ParallelFor(static_cast<int64_t>(pieces.size()), 16 << 14, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                const ForeachPiece& q = pieces[i];
                AdamWRange<T, S>(p[q.t], g[q.t], m[q.t], v[q.t], q.begin, q.end, c);
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "adamw_", AdamWKernel);
REGISTER_KERNEL(DeviceType::kCPU, "foreach_adamw_", ForeachAdamWKernel);

}  // namespace infinitrain::cpu
