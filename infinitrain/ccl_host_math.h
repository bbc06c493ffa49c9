// The arithmetic of collectives that reduce on the host (sim's in-process CCL, the cpu's Gloo CCL), so that both
// give the same results: storage type T accumulates in AccOf<T> (int64 for integers, so an avg sees the true sum
// of int32s; float or double for floats, as the host kernels do); integer sums and products wrap rather than
// overflow; an integer avg truncates toward zero; 16-bit floats round once, when stored.
#pragma once

#include <cstdint>
#include <type_traits>

#include "infinitrain/ccl.h"
#include "infinitrain/dtype_dispatch.h"

namespace infinitrain::ccl_host {

template <typename T>
using AccOf = std::conditional_t<std::is_integral_v<T>, int64_t, Acc<T>>;

template <typename A>
A Combine(A a, A b, ReduceOp op) {
    using U = std::make_unsigned_t<std::conditional_t<std::is_integral_v<A>, A, int>>;
    switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
            if constexpr (std::is_integral_v<A>) return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
            return a + b;
        case ReduceOp::kProd:
            if constexpr (std::is_integral_v<A>) return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
            return a * b;
        case ReduceOp::kMax:
            return b > a ? b : a;
        case ReduceOp::kMin:
            return b < a ? b : a;
    }
    return a;
}

template <typename T>
AccOf<T> LoadAcc(const T* p) {
    if constexpr (std::is_integral_v<T>) {
        return *p;
    } else {
        return Load(p);
    }
}

template <typename T, typename A>
void StoreAcc(T* p, A v) {
    if constexpr (std::is_integral_v<T>) {
        *p = static_cast<T>(static_cast<std::make_unsigned_t<T>>(static_cast<uint64_t>(v)));  // wraps
    } else {
        Store(p, v);
    }
}

// The dtypes these collectives reduce: the floats, int32 and int64.
inline bool CanReduce(DataType t) {
    switch (t) {
        case DataType::kFloat32:
        case DataType::kFloat64:
        case DataType::kBFloat16:
        case DataType::kFloat16:
        case DataType::kInt32:
        case DataType::kInt64:
            return true;
        default:
            return false;
    }
}

}  // namespace infinitrain::ccl_host
