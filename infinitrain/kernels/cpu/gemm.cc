// Matrix products on OpenBLAS (CBLAS, row-major).
//   matmul(a, b, trans_a, trans_b): out[..., M, N] = op(a)[..., M, K] @ op(b)[..., K, N]. a is stored [..., M, K]
//     ([..., K, M] when trans_a), b is stored [..., K, N] ([..., N, K] when trans_b); the batch dims (all but the
//     last two) broadcast: a size-1 or missing batch dim reuses the same matrix (batch stride 0).
//   linear(x, weight, bias?): out[R, O] = x[R, I] @ weight[O, I]^T + bias[O], R = the product of x's leading dims.
//   linear_weight_grad(grad, x, bias), linear_gelu_tanh, linear_dgelu_tanh: other ops' kernels (composed_kernels.h).
// float32 and float64 call sgemm/dgemm on the tensors directly. bfloat16 operands go to the bf16 kernels
// (bf16_gemm.h: float32 products and sums) where the CPU has bf16 units or INFINITRAIN_CPU_BF16_GEMM says so, else
// they are widened to float32 scratch for sgemm, as float16 always is; either way the float32 result is rounded
// back once.

#include <climits>
#include <type_traits>
#include <vector>

#include "infinitrain/composed_kernels.h"
#include "infinitrain/kernels/cpu/bf16_gemm.h"
#include "infinitrain/kernels/cpu/blas.h"
#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

// Widens a tensor to the compute type: the tensor's own data for float32/float64, a converted copy for bfloat16.
template <typename T, typename C = Acc<T>>
const C* Widen(const Tensor& t, std::vector<C>& buf) {
    if constexpr (std::is_same_v<T, C>) {
        return t.data<T>();
    } else {
        const T* p = t.data<T>();
        int64_t n = t.numel();
        buf.resize(n);
        ParallelFor(n, 1, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) buf[i] = Load(p + i);
        });
        return buf.data();
    }
}

// Writes compute-type results into the output tensor (only used for bfloat16).
template <typename T, typename C>
void Narrow(const C* src, const Tensor& t) {
    T* p = t.data<T>();
    ParallelFor(t.numel(), 2, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) Store(p + i, src[i]);
    });
}

// Matrix offsets (in matrices) into a and b for each output batch index, broadcasting size-1 / missing dims.
void BatchOffsets(const Shape& out_batch, const Shape& a_batch, const Shape& b_batch, std::vector<int64_t>& ao,
                  std::vector<int64_t>& bo) {
    int64_t nd = static_cast<int64_t>(out_batch.size());
    auto strides = [nd](const Shape& s) {
        std::vector<int64_t> st(nd, 0);
        int64_t off = nd - static_cast<int64_t>(s.size()), acc = 1;
        for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
            st[d + off] = s[d] == 1 ? 0 : acc;
            acc *= s[d];
        }
        return st;
    };
    std::vector<int64_t> sa = strides(a_batch), sb = strides(b_batch);
    int64_t count = Numel(out_batch);
    ao.resize(count);
    bo.resize(count);
    std::vector<int64_t> idx(nd, 0);
    int64_t oa = 0, ob = 0;
    for (int64_t i = 0; i < count; ++i) {
        ao[i] = oa;
        bo[i] = ob;
        // Odometer increment of the output batch index, updating both offsets.
        for (int64_t d = nd - 1; d >= 0; --d) {
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

// Runs one(i) for the count products of per = M * N * K each. Many small products: one thread per product. Few or
// big ones: serially, each product splitting its rows over the threads itself.
template <typename F>
void ForEachProduct(int64_t count, int64_t per, F&& one) {
    int64_t nt = omp_get_max_threads();
    bool batch_parallel = nt > 1 && count >= nt && count * per >= (1 << 16) && (per <= (1 << 21) || count >= 4 * nt);
    if (!batch_parallel) {
        for (int64_t i = 0; i < count; ++i) one(i);
        return;
    }
    RegionError error;  // an exception must not leave the region (std::terminate)
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) error.Run([&] { one(i); });
    error.Rethrow();
}

template <typename C>
void BatchedGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const C* a, const C* b, C* c,
                 const std::vector<int64_t>& ao, const std::vector<int64_t>& bo) {
    ForEachProduct(static_cast<int64_t>(ao.size()), m * n * k, [&](int64_t i) {
        Gemm<C>(ta, tb, m, n, k, C(1), a + ao[i] * m * k, b + bo[i] * k * n, C(0), c + i * m * n);
    });
}

// A bfloat16 tensor's bit patterns, as the bf16 kernels take them.
const uint16_t* Bits(const Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data<bf16>()); }
uint16_t* MutableBits(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data<bf16>()); }

// bfloat16 products on the bf16 kernels, rounded straight into the bfloat16 output.
void BatchedSbGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b,
                   const Tensor& out, const std::vector<int64_t>& ao, const std::vector<int64_t>& bo) {
    const uint16_t *ap = Bits(a), *bp = Bits(b);
    uint16_t* cp = MutableBits(out);
    ForEachProduct(static_cast<int64_t>(ao.size()), m * n * k, [&](int64_t i) {
        SbGemmBf16(ta, tb, m, n, k, 1.0f, ap + ao[i] * m * k, bp + bo[i] * k * n, nullptr, cp + i * m * n);
    });
}

void MatmulKernel(KernelContext& ctx) {
    const Tensor &a = ctx.in[0], &b = ctx.in[1];
    const Tensor& out = ctx.out[0];
    bool ta = ctx.i(0) != 0, tb = ctx.i(1) != 0;
    int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
    int64_t n = tb ? b.size(-2) : b.size(-1);
    CheckBlasSize("matmul", {m, n, k});
    if (out.numel() == 0) return;
    Shape a_batch(a.shape().begin(), a.shape().end() - 2), b_batch(b.shape().begin(), b.shape().end() - 2);
    Shape out_batch(out.shape().begin(), out.shape().end() - 2);
    std::vector<int64_t> ao, bo;
    // b shared by every batch and a not transposed: the batch folds into the rows of one big product.
    bool fold = !ta && Numel(b_batch) == 1 && Numel(a_batch) == Numel(out_batch);
    if (fold) {
        CheckBlasSize("matmul", {m * Numel(out_batch)});
        ao = {0};
        bo = {0};
        m *= Numel(out_batch);
    } else {
        BatchOffsets(out_batch, a_batch, b_batch, ao, bo);
    }
    if (a.dtype() == DataType::kBFloat16 && b.dtype() == DataType::kBFloat16 && UseSbGemm()) {
        BatchedSbGemm(ta, tb, m, n, k, a, b, out, ao, bo);
        return;
    }
    DispatchFloat(a.dtype(), "matmul", [&](auto tag) {
        using T = decltype(tag);
        using C = Acc<T>;
        std::vector<C> abuf, bbuf;
        const C* ap = Widen<T>(a, abuf);
        const C* bp = Widen<T>(b, bbuf);
        if constexpr (std::is_same_v<T, C>) {
            BatchedGemm<C>(ta, tb, m, n, k, ap, bp, out.data<T>(), ao, bo);
        } else {
            std::vector<C> cbuf(out.numel());
            BatchedGemm<C>(ta, tb, m, n, k, ap, bp, cbuf.data(), ao, bo);
            Narrow<T>(cbuf.data(), out);
        }
    });
}

void LinearKernel(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &w = ctx.in[1];
    const Tensor* bias = ctx.in.size() == 3 ? &ctx.in[2] : nullptr;
    const Tensor& out = ctx.out[0];
    int64_t in_f = w.size(1), out_f = w.size(0);
    int64_t rows = Numel(Shape(x.shape().begin(), x.shape().end() - 1));
    CheckBlasSize("linear", {rows, in_f, out_f});
    if (out.numel() == 0) return;
    if (x.dtype() == DataType::kBFloat16 && UseSbGemm()) {
        SbGemmBf16(false, true, rows, out_f, in_f, 1.0f, Bits(x), Bits(w), bias ? Bits(*bias) : nullptr,
                   MutableBits(out));
        return;
    }
    DispatchFloat(x.dtype(), "linear", [&](auto tag) {
        using T = decltype(tag);
        using C = Acc<T>;
        std::vector<C> xbuf, wbuf, cbuf;
        C* cp;
        if constexpr (std::is_same_v<T, C>) {
            cp = out.data<T>();
        } else {
            cbuf.resize(out.numel());
            cp = cbuf.data();
        }
        // The bias is written first and the product accumulated onto it (beta = 1).
        if (bias) {
            const T* bp = bias->data<T>();
            ParallelFor(rows, out_f, [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) {
                    for (int64_t o = 0; o < out_f; ++o) cp[r * out_f + o] = Load(bp + o);
                }
            });
        }
        const C* xp = Widen<T>(x, xbuf);
        const C* wp = Widen<T>(w, wbuf);
        Gemm<C>(false, true, rows, out_f, in_f, C(1), xp, wp, bias ? C(1) : C(0), cp);
        if constexpr (!std::is_same_v<T, C>) Narrow<T>(cp, out);
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "matmul", MatmulKernel);
REGISTER_KERNEL(DeviceType::kCPU, "linear", LinearKernel);
REGISTER_KERNEL(DeviceType::kCPU, "linear_weight_grad", LinearWeightGradFromOps);
REGISTER_KERNEL(DeviceType::kCPU, "linear_gelu_tanh", LinearGeluTanhFromOps);
REGISTER_KERNEL(DeviceType::kCPU, "linear_dgelu_tanh", LinearDgeluTanhFromOps);

}  // namespace infinitrain::cpu
