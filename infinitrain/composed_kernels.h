// Kernels made of other ops' kernels on the same device, stream and thread (RunKernelOf), for fused ops whose
// numbers are those of the ops they fuse. The CPU and the portable GPU layer register the same ones.
#pragma once

#include <cstdint>
#include <vector>

#include "infinitrain/op.h"
#include "infinitrain/tensor.h"

namespace infinitrain {

// linear_weight_grad(grad, x; bias): dweight = grad[R, O]^T @ x[R, I] (matmul's kernel) and, when bias is 1,
// dbias = grad's column sums (sum's kernel).
inline void LinearWeightGradFromOps(KernelContext& ctx) {
    const Tensor &g = ctx.in[0], &x = ctx.in[1];
    const int64_t out_f = g.size(-1), in_f = x.size(-1), rows = Numel(Shape(g.shape().begin(), g.shape().end() - 1));
    const Tensor g2 = g.Reshape({rows, out_f});
    std::vector<Tensor> dw{ctx.out[0]}, db{ctx.out[1]};
    RunKernelOf("matmul", ctx, {g2, x.Reshape({rows, in_f})}, dw, {int64_t{1}, int64_t{0}});
    if (ctx.i(0)) RunKernelOf("sum", ctx, {g2}, db, {std::vector<int64_t>{0}, int64_t{0}});
}

}  // namespace infinitrain
