// Optimizer steps, elementwise and in place over flat tensors.
//   adamw_(param, grad, m, v; lr, beta1, beta2, eps, weight_decay, step), PyTorch's AdamW, the CPU's formula:
//     param *= 1 - lr * weight_decay
//     m = beta1 * m + (1 - beta1) * grad;  v = beta2 * v + (1 - beta2) * grad^2
//     param -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
// Precision: the arithmetic is in double (the bias corrections come from the host); m and v are stored as float32
// (float64 for float64 params), and the update uses the unrounded new m and v; bfloat16/float16 params go
// through float32 before their rounding, as on the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

struct AdamWParams {
    double lr, beta1, beta2, eps, decay, bc1, bc2;
};

// From the attributes (lr, beta1, beta2, eps, weight_decay, step) on the host, the CPU's way.
inline AdamWParams AdamWParamsOf(const KernelContext& ctx) {
    const double lr = ctx.f(0), b1 = ctx.f(1), b2 = ctx.f(2), eps = ctx.f(3), wd = ctx.f(4);
    const double step = static_cast<double>(ctx.i(5));
    return {lr, b1, b2, eps, 1.0 - lr * wd, 1.0 - std::pow(b1, step), 1.0 - std::pow(b2, step)};
}

// Element i of one (param, grad, m, v) set: adamw_'s arithmetic, shared by AdamWKernel and foreach_adamw_'s kernel
// (foreach.cuh) so that the two give the same bits.
template <typename T>
__device__ __forceinline__ void AdamWStep(T* __restrict__ param, const T* __restrict__ grad, Acc<T>* __restrict__ m,
                                          Acc<T>* __restrict__ v, int64_t i, const AdamWParams& h) {
    using S = Acc<T>;
    const double g = static_cast<double>(ToAcc(grad[i]));
    const double mi = h.beta1 * static_cast<double>(m[i]) + (1.0 - h.beta1) * g;
    const double vi = h.beta2 * static_cast<double>(v[i]) + (1.0 - h.beta2) * g * g;
    m[i] = static_cast<S>(mi);
    v[i] = static_cast<S>(vi);
    double p = static_cast<double>(ToAcc(param[i])) * h.decay;
    p -= h.lr * (mi / h.bc1) / (sqrt(vi / h.bc2) + h.eps);
    param[i] = FromAcc<T>(static_cast<S>(p));
}

template <typename T>
__global__ void AdamWKernel(T* __restrict__ param, const T* __restrict__ grad, Acc<T>* __restrict__ m,
                            Acc<T>* __restrict__ v, int64_t n, AdamWParams h) {
    GPU_KERNEL_LOOP(i, n) { AdamWStep(param, grad, m, v, i, h); }
}

}  // namespace infinitrain::gpu
