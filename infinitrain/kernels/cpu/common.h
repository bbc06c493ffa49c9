// Shared helpers for CPU kernels: dtype dispatch on the host types (from
// infinitrain/dtype_dispatch.h), and a parallel-for that stays serial for small work.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "infinitrain/dtype.h"
#include "infinitrain/dtype_dispatch.h"
#include "infinitrain/kernels/cpu/parallel.h"
#include "infinitrain/op.h"

namespace infinitrain::cpu {

using ::infinitrain::Acc;
using ::infinitrain::Load;
using ::infinitrain::Store;

// Calls f(T{}) with T = float, double, bf16 or f16 to match `t`; other dtypes raise naming the op.
template <typename F>
void DispatchFloat(DataType t, const char* op, F&& f) {
    dispatch::DispatchFloat(t, op, [&](auto tag) { f(typename decltype(tag)::type{}); });
}

// Runs fn(begin, end) over [0, n) in chunks across threads when n * cost is large enough to pay for it.
template <typename F>
void ParallelFor(int64_t n, int64_t cost_per_item, F&& fn) {
    constexpr int64_t kSerialWork = 1 << 15;
    if (n <= 1 || n * cost_per_item < kSerialWork || omp_get_max_threads() == 1) {
        fn(int64_t{0}, n);
        return;
    }
    RegionError error;  // an exception must not leave the region (std::terminate)
#pragma omp parallel
    {
        int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t chunk = (n + nt - 1) / nt;
        int64_t b = id * chunk, e = b + chunk < n ? b + chunk : n;
        if (b < e) error.Run([&] { fn(b, e); });
    }
    error.Rethrow();
}

// Elements [begin, end) of tensor t of a multi-tensor (foreach) op.
struct ForeachPiece {
    int64_t t, begin, end;
};

// Tensors in[first], ..., in[first + count - 1] cut into pieces of `chunk` elements (each tensor's last one shorter,
// an empty tensor none), in tensor order: a partition fixed by the shapes alone, so per-piece partial sums added in
// order do not depend on the thread count.
inline std::vector<ForeachPiece> ForeachPieces(const std::vector<Tensor>& in, size_t first, size_t count,
                                               int64_t chunk) {
    std::vector<ForeachPiece> pieces;
    for (size_t k = 0; k < count; ++k) {
        const int64_t n = in[first + k].numel();
        for (int64_t b = 0; b < n; b += chunk) pieces.push_back({static_cast<int64_t>(k), b, std::min(n, b + chunk)});
    }
    return pieces;
}

}  // namespace infinitrain::cpu
