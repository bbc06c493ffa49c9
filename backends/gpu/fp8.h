// The portable FP8 pieces a provider's vendor GEMM builds on (ops_fp8.cu): a byte transpose, to give a float8
// operand the layout FP8 tensor cores take, and the plain fp8_matmul kernel to fall back to where the vendor
// library declines a shape. fp8_quantize itself is a provider kernel of every CUDA-dialect provider.
#pragma once

#include "infinitrain/op.h"
#include "infinitrain/tensor.h"

namespace infinitrain::gpu {

// dst [cols, rows] = src [rows, cols]^T, one byte an element (float8), on the op's stream.
void TransposeBytes(const KernelContext& ctx, const Tensor& src, const Tensor& dst, int64_t rows, int64_t cols);

// out[i, j] += bias[j] for float32 out [m, n] (FP8 GEMMs with a float32 output take no bias in the epilogue).
void AddBiasFloat32(const KernelContext& ctx, const Tensor& out, const Tensor& bias, int64_t m, int64_t n);

// fp8_matmul by a plain kernel: one thread an output, float32 sums in k order.
void PortableFp8Matmul(KernelContext& ctx);

}  // namespace infinitrain::gpu
