// sort: each row of x (its last dim) in ascending or descending order, with the int64 positions the values came
// from. NaN counts as larger than every number (last ascending, first descending), as PyTorch orders it. Equal
// values keep their order (a stable sort), which also serves stable=0. Rows split across threads.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

// a before b in ascending order, NaN last.
template <typename V>
bool Less(V a, V b) {
    return std::isnan(b) ? !std::isnan(a) : a < b;
}

void SortKernel(KernelContext& c) {
    const Tensor &x = c.in[0], &values = c.out[0], &indices = c.out[1];
    const bool descending = c.i(0) != 0;
    const int64_t n = x.dim() ? x.size(-1) : 1;
    const int64_t rows = n ? x.numel() / n : 0;
    DispatchFloat(x.dtype(), "sort", [&](auto tag) {
        using T = decltype(tag);
        using V = Acc<T>;
        const T* px = x.data<T>();
        T* pv = values.data<T>();
        int64_t* pi = indices.data<int64_t>();
        ParallelFor(rows, n * 16, [&](int64_t b, int64_t e) {
            std::vector<int64_t> order(n);
            std::vector<V> key(n);
            for (int64_t r = b; r < e; ++r) {
                const T* row = px + r * n;
                for (int64_t j = 0; j < n; ++j) key[j] = Load(row + j);
                std::iota(order.begin(), order.end(), int64_t{0});
                if (descending) {
                    std::stable_sort(order.begin(), order.end(),
                                     [&](int64_t i, int64_t j) { return Less(key[j], key[i]); });
                } else {
                    std::stable_sort(order.begin(), order.end(),
                                     [&](int64_t i, int64_t j) { return Less(key[i], key[j]); });
                }
                for (int64_t j = 0; j < n; ++j) {
                    pv[r * n + j] = row[order[j]];
                    pi[r * n + j] = order[j];
                }
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "sort", SortKernel);

}  // namespace infinitrain::cpu
