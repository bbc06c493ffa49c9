// Optimizer steps, elementwise and in place over flat tensors.
//   adamw_(param, grad, m, v; lr, beta1, beta2, eps, weight_decay, step), PyTorch's AdamW, the CPU's formula:
//     param *= 1 - lr * weight_decay
//     m = beta1 * m + (1 - beta1) * grad;  v = beta2 * v + (1 - beta2) * grad^2
//     param -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
// Precision: the arithmetic is in double (the bias corrections come from the host); m and v are stored as float32
// (float64 for float64 params), and the update uses the unrounded new m and v; bfloat16/float16 params go
// through float32 before their rounding, as on the CPU.
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

struct AdamWParams {
    double lr, beta1, beta2, eps, decay, bc1, bc2;
};

template <typename T>
__global__ void AdamWKernel(T* __restrict__ param, const T* __restrict__ grad, Acc<T>* __restrict__ m,
                            Acc<T>* __restrict__ v, int64_t n, AdamWParams h) {
    using S = Acc<T>;
    GPU_KERNEL_LOOP(i, n) {
        const double g = static_cast<double>(ToAcc(grad[i]));
        const double mi = h.beta1 * static_cast<double>(m[i]) + (1.0 - h.beta1) * g;
        const double vi = h.beta2 * static_cast<double>(v[i]) + (1.0 - h.beta2) * g * g;
        m[i] = static_cast<S>(mi);
        v[i] = static_cast<S>(vi);
        double p = static_cast<double>(ToAcc(param[i])) * h.decay;
        p -= h.lr * (mi / h.bc1) / (sqrt(vi / h.bc2) + h.eps);
        param[i] = FromAcc<T>(static_cast<S>(p));
    }
}

}  // namespace infinitrain::gpu
