// cumsum: inclusive prefix sums of x along one dim (reverse: suffix sums, for the backward).
//
// Layout: x contiguous [outer, n, inner] around the scanned dim. Each (outer, inner) column is summed in order,
// columns split across threads. Precision: float32 and float64 accumulate in double, bfloat16 and float16 in
// float; each prefix is rounded once to x's dtype.
#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

template <typename T>
using ScanAcc = std::conditional_t<std::is_same_v<T, float> || std::is_same_v<T, double>, double, float>;

void CumsumKernel(KernelContext& c) {
    const Tensor &x = c.in[0], &out = c.out[0];
    const int64_t dim = NormalizeDim("cumsum", c.i(0), x.dim());
    const bool reverse = c.i(1) != 0;
    const int64_t n = x.size(dim);
    int64_t inner = 1;
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const int64_t outer = n * inner ? x.numel() / (n * inner) : 0;
    DispatchFloat(x.dtype(), "cumsum", [&](auto tag) {
        using T = decltype(tag);
        using A = ScanAcc<T>;
        const T* px = x.data<T>();
        T* po = out.data<T>();
        ParallelFor(outer * inner, n, [&](int64_t b, int64_t e) {
            for (int64_t col = b; col < e; ++col) {
                const int64_t base = (col / inner) * n * inner + col % inner;
                A s = 0;
                for (int64_t j = 0; j < n; ++j) {
                    const int64_t k = base + (reverse ? n - 1 - j : j) * inner;
                    s += static_cast<A>(Load(px + k));
                    Store(po + k, static_cast<Acc<T>>(s));
                }
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "cumsum", CumsumKernel);

}  // namespace infinitrain::cpu
