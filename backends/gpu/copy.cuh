// Copy, cast and fill between all nine dtypes.
//
// Layout: contiguous tensors of equal numel. Every conversion goes through
// double, as the CPU kernel does: exact for every integer and float type
// here, so results match it bit for bit. Floats to integers truncate toward
// zero; bool is v != 0; float16 from double rounds once; bfloat16 from double
// rounds through float32 (the CPU's cast and fill do the same).
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"
#include "backends/gpu/map.cuh"
#include "infinitrain/fp8.h"

namespace infinitrain::gpu {

template <DataType D>
struct StorageT;
template <>
struct StorageT<DataType::kBool> {
    using type = uint8_t;
};
template <>
struct StorageT<DataType::kUInt8> {
    using type = uint8_t;
};
template <>
struct StorageT<DataType::kInt8> {
    using type = int8_t;
};
template <>
struct StorageT<DataType::kInt32> {
    using type = int32_t;
};
template <>
struct StorageT<DataType::kInt64> {
    using type = int64_t;
};
template <>
struct StorageT<DataType::kFloat16> {
    using type = fp16_t;
};
template <>
struct StorageT<DataType::kBFloat16> {
    using type = bf16_t;
};
template <>
struct StorageT<DataType::kFloat32> {
    using type = float;
};
template <>
struct StorageT<DataType::kFloat64> {
    using type = double;
};
template <>
struct StorageT<DataType::kFloat8E4M3> {
    using type = uint8_t;
};
template <>
struct StorageT<DataType::kFloat8E5M2> {
    using type = uint8_t;
};
template <DataType D>
using Storage = typename StorageT<D>::type;

template <DataType S>
__device__ __forceinline__ double ToDouble(Storage<S> v) {
    if constexpr (S == DataType::kBool) {
        return v ? 1.0 : 0.0;
    } else if constexpr (S == DataType::kFloat8E4M3 || S == DataType::kFloat8E5M2) {
        return Fp8ToFloat<S == DataType::kFloat8E5M2>(v);
    } else if constexpr (S == DataType::kFloat16 || S == DataType::kBFloat16) {
        return ToFloat(v);
    } else {
        return static_cast<double>(v);
    }
}

template <DataType D>
__device__ __forceinline__ Storage<D> FromDouble(double v) {
    if constexpr (D == DataType::kBool) {
        return v != 0.0;
    } else if constexpr (D == DataType::kFloat16) {
        return DoubleToFP16(v);
    } else if constexpr (D == DataType::kBFloat16) {
        return FloatToBF16(static_cast<float>(v));
    } else if constexpr (D == DataType::kFloat8E4M3 || D == DataType::kFloat8E5M2) {
        return FloatToFp8<D == DataType::kFloat8E5M2>(static_cast<float>(v));  // float64 rounds twice
    } else {
        return static_cast<Storage<D>>(v);
    }
}

template <DataType S, DataType D>
struct ConvertOp {
    __device__ __forceinline__ Storage<D> operator()(Storage<S> v) const { return FromDouble<D>(ToDouble<S>(v)); }
};

template <DataType D>
__global__ void FillKernel(Storage<D>* __restrict__ y, int64_t n, double value) {
    const Storage<D> v = FromDouble<D>(value);
    GPU_KERNEL_LOOP(i, n) { y[i] = v; }
}

// Calls f(std::integral_constant<DataType, t>{}) for a runtime dtype.
template <typename F>
void DispatchAll(DataType t, F&& f) {
    switch (t) {
        case DataType::kBool:
            return f(std::integral_constant<DataType, DataType::kBool>{});
        case DataType::kUInt8:
            return f(std::integral_constant<DataType, DataType::kUInt8>{});
        case DataType::kInt8:
            return f(std::integral_constant<DataType, DataType::kInt8>{});
        case DataType::kInt32:
            return f(std::integral_constant<DataType, DataType::kInt32>{});
        case DataType::kInt64:
            return f(std::integral_constant<DataType, DataType::kInt64>{});
        case DataType::kFloat16:
            return f(std::integral_constant<DataType, DataType::kFloat16>{});
        case DataType::kBFloat16:
            return f(std::integral_constant<DataType, DataType::kBFloat16>{});
        case DataType::kFloat32:
            return f(std::integral_constant<DataType, DataType::kFloat32>{});
        case DataType::kFloat64:
            return f(std::integral_constant<DataType, DataType::kFloat64>{});
        case DataType::kFloat8E4M3:
            return f(std::integral_constant<DataType, DataType::kFloat8E4M3>{});
        case DataType::kFloat8E5M2:
            return f(std::integral_constant<DataType, DataType::kFloat8E5M2>{});
    }
}

// dst[i] = src[i] converted, for n elements (same dtype: a device copy). Defined in ops_copy.cu, so the
// conversion kernels are compiled once; other op files (reductions, attention) call it.
void LaunchConvert(const void* src, DataType st, void* dst, DataType dt, int64_t n, NativeStream_t s, const char* op);

// y[i] = value converted to the dtype, for n elements. Defined in ops_copy.cu.
void LaunchFill(void* y, DataType t, int64_t n, double value, NativeStream_t s, const char* op);

}  // namespace infinitrain::gpu
