// Optimizer steps, elementwise and in place over flat tensors.
//   adamw_(param, grad, m, v; lr, beta1, beta2, eps, weight_decay, step), PyTorch's AdamW:
//     param -= lr * weight_decay * param
//     m = beta1 * m + (1 - beta1) * grad;  v = beta2 * v + (1 - beta2) * grad^2
//     param -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
//   m and v are float32 (float64 for float64 params). The arithmetic is in double; bfloat16 params are loaded to
//   float and rounded on store.
#include <cmath>

#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

void AdamWKernel(KernelContext& ctx) {
    const Tensor &param = ctx.in[0], &grad = ctx.in[1], &m_t = ctx.in[2], &v_t = ctx.in[3];
    double lr = ctx.f(0), b1 = ctx.f(1), b2 = ctx.f(2), eps = ctx.f(3), wd = ctx.f(4);
    double step = static_cast<double>(ctx.i(5));
    double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
    double decay = 1.0 - lr * wd;
    DispatchFloat(param.dtype(), "adamw_", [&](auto tag) {
        using T = decltype(tag);
        using S = Acc<T>;
        T* p = param.data<T>();
        const T* g = grad.data<T>();
        S *m = m_t.data<S>(), *v = v_t.data<S>();
        ParallelFor(param.numel(), 16, [&](int64_t b, int64_t e) {
#pragma omp simd
            for (int64_t i = b; i < e; ++i) {
                double gi = Load(g + i);
                double mi = b1 * m[i] + (1.0 - b1) * gi;
                double vi = b2 * v[i] + (1.0 - b2) * gi * gi;
                m[i] = static_cast<S>(mi);
                v[i] = static_cast<S>(vi);
                double pi = Load(p + i) * decay;
                pi -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
                Store(p + i, static_cast<S>(pi));
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "adamw_", AdamWKernel);

}  // namespace infinitrain::cpu
