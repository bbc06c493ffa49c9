// Dispatch from a DataType to the C++ type that stores it, for kernels of any
// device. A type map names the storage types a device uses for the 16-bit
// floats; HostTypes is the CPU's, and a provider writes its own, e.g.
//
//   struct CudaTypes { using BFloat16 = __nv_bfloat16; using Float16 = __half; };
//   dispatch::DispatchFloat<CudaTypes>(t, "gelu", [&](auto tag) { using T = typename decltype(tag)::type; ... });
//
// The functor receives a TypeTag<T>, so T need not be constructible on the host.
// Also the host's arithmetic for its storage types (Acc, Load, Store), which
// the CPU kernels and host-side collectives share.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "infinitrain/dtype.h"

namespace infinitrain {

struct HostTypes {
    using BFloat16 = bf16;
    using Float16 = f16;
};

template <typename T>
struct TypeTag {
    using type = T;
};

// In a namespace of their own, so that argument-dependent lookup on DataType does not find them.
namespace dispatch {

[[noreturn]] inline void Unsupported(DataType t, const char* op, const char* what) {
    throw std::invalid_argument(std::string(op) + ": no " + DataTypeName(t) + " variant (" + what + " only)");
}

// float32, float64, bfloat16, float16.
template <typename Map = HostTypes, typename F>
void DispatchFloat(DataType t, const char* op, F&& f) {
    switch (t) {
        case DataType::kFloat32:
            return f(TypeTag<float>{});
        case DataType::kFloat64:
            return f(TypeTag<double>{});
        case DataType::kBFloat16:
            return f(TypeTag<typename Map::BFloat16>{});
        case DataType::kFloat16:
            return f(TypeTag<typename Map::Float16>{});
        default:
            Unsupported(t, op, "float32, float64, bfloat16, float16");
    }
}

// The float dtypes plus int32 and int64 (comparisons, reductions in collectives).
template <typename Map = HostTypes, typename F>
void DispatchNumeric(DataType t, const char* op, F&& f) {
    switch (t) {
        case DataType::kInt32:
            return f(TypeTag<int32_t>{});
        case DataType::kInt64:
            return f(TypeTag<int64_t>{});
        case DataType::kFloat32:
        case DataType::kFloat64:
        case DataType::kBFloat16:
        case DataType::kFloat16:
            return DispatchFloat<Map>(t, op, static_cast<F&&>(f));
        default:
            Unsupported(t, op, "floats, int32, int64");
    }
}

// Every dtype.
template <typename Map = HostTypes, typename F>
void DispatchAll(DataType t, const char* op, F&& f) {
    switch (t) {
        case DataType::kBool:
            return f(TypeTag<bool>{});
        case DataType::kUInt8:
            return f(TypeTag<uint8_t>{});
        case DataType::kInt8:
            return f(TypeTag<int8_t>{});
        default:
            return DispatchNumeric<Map>(t, op, static_cast<F&&>(f));
    }
}

}  // namespace dispatch

// ---- host arithmetic on host storage types ----

// Arithmetic type for a float storage type: float for float32, bfloat16 and float16, double for float64.
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

}  // namespace infinitrain
