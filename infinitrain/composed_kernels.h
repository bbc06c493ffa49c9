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

// linear_gelu_tanh(x, weight, bias?): pre = linear's kernel, out = gelu_tanh's kernel of pre.
inline void LinearGeluTanhFromOps(KernelContext& ctx) {
    std::vector<Tensor> pre{ctx.out[1]}, out{ctx.out[0]};
    RunKernelOf("linear", ctx, ctx.in, pre, {});
    RunKernelOf("gelu_tanh", ctx, {ctx.out[1]}, out, {});
}

// linear_dgelu_tanh(grad, weight, pre; bias): dpre = gelu_tanh_backward(pre, grad @ weight) (matmul's and
// gelu_tanh_backward's kernels, the product in a scratch tensor) and, when bias is 1, dbias = dpre's column sums.
inline void LinearDgeluTanhFromOps(KernelContext& ctx) {
    const Tensor &g = ctx.in[0], &w = ctx.in[1], &pre = ctx.in[2];
    const int64_t out_f = g.size(-1), in_f = w.size(1), rows = Numel(Shape(g.shape().begin(), g.shape().end() - 1));
    std::vector<Tensor> prod{Tensor::Empty({rows, in_f}, g.dtype(), ctx.device)};
    RunKernelOf("matmul", ctx, {g.Reshape({rows, out_f}), w}, prod, {int64_t{0}, int64_t{0}});
    const Tensor dpre = ctx.out[0].Reshape({rows, in_f});
    std::vector<Tensor> dx{dpre}, db{ctx.out[1]};
    RunKernelOf("gelu_tanh_backward", ctx, {pre.Reshape({rows, in_f}), prod[0]}, dx, {});
    if (ctx.i(0)) RunKernelOf("sum", ctx, {dpre}, db, {std::vector<int64_t>{0}, int64_t{0}});
}

}  // namespace infinitrain
