// Shared helpers for CPU kernels: dtype dispatch, load/store with float
// accumulation for bfloat16, and a parallel-for that stays serial for small work.
#pragma once

#include <omp.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "infinitrain/dtype.h"
#include "infinitrain/kernels/cpu/parallel.h"
#include "infinitrain/op.h"

namespace infinitrain::cpu {

// Arithmetic type for a storage type: float for float32, bfloat16 and float16, double for float64.
template <typename T>
struct AccT {
    using type = float;
};
template <>
struct AccT<double> {
    using type = double;
};
template <typename T>
using Acc = typename AccT<T>::type;

inline float Load(const float* p) { return *p; }
inline double Load(const double* p) { return *p; }
inline float Load(const bf16* p) { return BF16ToFloat(p->bits); }
inline float Load(const f16* p) { return HalfToFloat(p->bits); }
inline void Store(float* p, float v) { *p = v; }
inline void Store(double* p, double v) { *p = v; }
inline void Store(bf16* p, float v) { p->bits = FloatToBF16(v); }
inline void Store(f16* p, float v) { p->bits = FloatToHalf(v); }

// Calls f(T{}) with T = float, double, bf16 or f16 to match `t`; other dtypes raise.
template <typename F>
void DispatchFloat(DataType t, const char* op, F&& f) {
    switch (t) {
        case DataType::kFloat32:
            f(float{});
            return;
        case DataType::kFloat64:
            f(double{});
            return;
        case DataType::kBFloat16:
            f(bf16{});
            return;
        case DataType::kFloat16:
            f(f16{});
            return;
        default:
            OpError(op, std::string("cpu kernel has no ") + DataTypeName(t) + " variant");
    }
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

}  // namespace infinitrain::cpu
