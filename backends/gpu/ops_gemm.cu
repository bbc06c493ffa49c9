// Op adapters for matmul and linear (row-major GEMMs in gemm.cuh).
//   matmul(a, b, trans_a, trans_b): out[..., M, N] = op(a)[..., M, K] @ op(b)[..., K, N], batch dims broadcast.
//     b shared by every batch and a not transposed: the batch folds into the rows of one product. Otherwise the
//     output batches are walked in order and cut into runs where both operands advance by constant strides
//     (0 for a broadcast operand): each run is one strided-batched call, so [B, H] @ [B, H] or [B, H] @ [1, H]
//     is one call and only a two-sided broadcast like [2, 1] @ [1, 3] needs several.
//   linear(x, weight, bias?): out[R, O] = x[R, I] @ weight[O, I]^T (+ bias broadcast into out first, beta = 1; small
//     16-bit outputs add it to a float32 product instead, so they are rounded once).
//   linear_weight_grad(grad, x, bias): dweight = grad[R, O]^T @ x[R, I] and dbias = grad's column sums, as the
//     matmul and sum kernels compute them.
//   linear_gelu_tanh and linear_dgelu_tanh: the linear / matmul kernels and the GELU kernels after them.
#include <vector>

#include "backends/gpu/context.h"
#include "backends/gpu/gemm.cuh"
#include "backends/gpu/gemm.h"
#include "infinitrain/composed_kernels.h"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

// Matrix offsets (in matrices) into a and b for each output batch index, broadcasting size-1 / missing dims.
void BatchOffsets(const Shape& out_batch, const Shape& a_batch, const Shape& b_batch, std::vector<int64_t>& ao,
                  std::vector<int64_t>& bo) {
    const int64_t nd = static_cast<int64_t>(out_batch.size());
    auto strides = [nd](const Shape& s) {
        std::vector<int64_t> st(nd, 0);
        int64_t off = nd - static_cast<int64_t>(s.size()), acc = 1;
        for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
            st[d + off] = s[d] == 1 ? 0 : acc;
            acc *= s[d];
        }
        return st;
    };
    const std::vector<int64_t> sa = strides(a_batch), sb = strides(b_batch);
    const int64_t count = Numel(out_batch);
    ao.resize(count);
    bo.resize(count);
    std::vector<int64_t> idx(nd, 0);
    int64_t oa = 0, ob = 0;
    for (int64_t i = 0; i < count; ++i) {
        ao[i] = oa;
        bo[i] = ob;
        for (int64_t d = nd - 1; d >= 0; --d) {  // odometer step of the output batch index
            if (++idx[d] < out_batch[d]) {
                oa += sa[d];
                ob += sb[d];
                break;
            }
            oa -= sa[d] * (out_batch[d] - 1);
            ob -= sb[d] * (out_batch[d] - 1);
            idx[d] = 0;
        }
    }
}

void Matmul(KernelContext& ctx) {
    const Tensor &a = ctx.in[0], &b = ctx.in[1], &out = ctx.out[0];
    const bool ta = ctx.i(0) != 0, tb = ctx.i(1) != 0;
    int64_t m = ta ? a.size(-1) : a.size(-2);
    const int64_t k = ta ? a.size(-2) : a.size(-1), n = tb ? b.size(-2) : b.size(-1);
    BlasInt("matmul", m);
    BlasInt("matmul", n);
    BlasInt("matmul", k);
    if (out.numel() == 0) return;
    const Shape a_batch(a.shape().begin(), a.shape().end() - 2), b_batch(b.shape().begin(), b.shape().end() - 2);
    const Shape out_batch(out.shape().begin(), out.shape().end() - 2);
    const int64_t count = Numel(out_batch);
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(a.dtype(), "matmul", [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T *ap = a.data<T>(), *bp = b.data<T>();
        T* cp = out.data<T>();
        BlasHandle h = Blas(ctx);
        if (!ta && Numel(b_batch) == 1 && Numel(a_batch) == count && m * count <= INT_MAX) {
            RowMajorGemm<T, T>("matmul", h, s, false, tb, m * count, n, k, 1.0, ap, 0, bp, 0, 0.0, cp, 0, 1);
            return;
        }
        std::vector<int64_t> ao, bo;
        BatchOffsets(out_batch, a_batch, b_batch, ao, bo);
        const int64_t mk = m * k, kn = k * n, mn = m * n;
        for (int64_t i = 0; i < count;) {
            int64_t j = i + 1, da = 0, db = 0;
            if (j < count && ao[j] >= ao[i] && bo[j] >= bo[i]) {  // a run of non-negative strides
                da = ao[j] - ao[i];
                db = bo[j] - bo[i];
                while (j + 1 < count && ao[j + 1] - ao[j] == da && bo[j + 1] - bo[j] == db) ++j;
                ++j;
            }
            RowMajorGemm<T, T>("matmul", h, s, ta, tb, m, n, k, 1.0, ap + ao[i] * mk, da * mk, bp + bo[i] * kn, db * kn,
                               0.0, cp + i * mn, mn, j - i);
            i = j;
        }
    });
}

}  // namespace

// 16-bit outputs up to this many elements (a few tiles per multiprocessor, where a BLAS splits K) take the bias
// on a float32 product: on the H200, cuBLAS's split-K plans for a beta = 1 GEMM round the product to bfloat16
// before adding C, a second rounding. Larger outputs keep the bias rows and one GEMM, which saves the float32 pass.
constexpr int64_t kSmallOutput = int64_t{1} << 22;

void PortableLinear(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &w = ctx.in[1], &out = ctx.out[0];
    const Tensor* bias = ctx.in.size() == 3 ? &ctx.in[2] : nullptr;
    const int64_t in_f = w.size(1), out_f = w.size(0);
    const int64_t nrows = Numel(Shape(x.shape().begin(), x.shape().end() - 1));
    BlasInt("linear", nrows);
    BlasInt("linear", in_f);
    BlasInt("linear", out_f);
    if (out.numel() == 0) return;
    NativeStream_t s = NativeStream(ctx);
    DispatchFloat(x.dtype(), "linear", [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (sizeof(T) == 2) {
            if (bias && nrows * out_f <= kSmallOutput) {
                Tensor acc = Scratch(ctx, {nrows, out_f}, DataType::kFloat32);
                RowMajorGemm<T, float>("linear", Blas(ctx), s, false, true, nrows, out_f, in_f, 1.0, x.data<T>(), 0,
                                       w.data<T>(), 0, 0.0, acc.data<float>(), 0, 1);
                AddBiasRoundKernel<T><<<Blocks(nrows * out_f), kThreads, 0, s>>>(acc.data<float>(), bias->data<T>(),
                                                                                 out.data<T>(), nrows, out_f);
                GPU_CHECK_LAUNCH("linear");
                return;
            }
        }
        if (bias) {
            BiasRowsKernel<T><<<Blocks(nrows * out_f), kThreads, 0, s>>>(bias->data<T>(), out.data<T>(), nrows, out_f);
            GPU_CHECK_LAUNCH("linear");
        }
        RowMajorGemm<T, T>("linear", Blas(ctx), s, false, true, nrows, out_f, in_f, 1.0, x.data<T>(), 0, w.data<T>(), 0,
                           bias ? 1.0 : 0.0, out.data<T>(), 0, 1);
    });
}

void PortableLinearWeightGrad(KernelContext& ctx) { LinearWeightGradFromOps(ctx); }

REGISTER_PROVIDER_KERNEL(kProviderName, "matmul", Matmul);
REGISTER_PROVIDER_KERNEL(kProviderName, "linear", PortableLinear);
REGISTER_PROVIDER_KERNEL(kProviderName, "linear_weight_grad", PortableLinearWeightGrad);
REGISTER_PROVIDER_KERNEL(kProviderName, "linear_gelu_tanh", LinearGeluTanhFromOps);
REGISTER_PROVIDER_KERNEL(kProviderName, "linear_dgelu_tanh", LinearDgeluTanhFromOps);

}  // namespace infinitrain::gpu
