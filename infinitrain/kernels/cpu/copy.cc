// Copy, cast and fill. Every dtype converts through double (exact for all
// integer and float types here) except the float fast paths; float8 through
// float (infinitrain/fp8.h), so float64 -> float8 rounds twice.
#include <cstring>

#include "infinitrain/fp8.h"
#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

double LoadAny(const void* p, DataType t, int64_t i) {
    switch (t) {
        case DataType::kBool:
            return static_cast<const uint8_t*>(p)[i] ? 1.0 : 0.0;
        case DataType::kUInt8:
            return static_cast<const uint8_t*>(p)[i];
        case DataType::kInt8:
            return static_cast<const int8_t*>(p)[i];
        case DataType::kInt32:
            return static_cast<const int32_t*>(p)[i];
        case DataType::kInt64:
            return static_cast<double>(static_cast<const int64_t*>(p)[i]);
        case DataType::kFloat16:
            return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
        case DataType::kBFloat16:
            return BF16ToFloat(static_cast<const uint16_t*>(p)[i]);
        case DataType::kFloat32:
            return static_cast<const float*>(p)[i];
        case DataType::kFloat64:
            return static_cast<const double*>(p)[i];
        case DataType::kFloat8E4M3:
            return Fp8ToFloat<false>(static_cast<const uint8_t*>(p)[i]);
        case DataType::kFloat8E5M2:
            return Fp8ToFloat<true>(static_cast<const uint8_t*>(p)[i]);
    }
    return 0;
}

void StoreAny(void* p, DataType t, int64_t i, double v) {
    switch (t) {
        case DataType::kBool:
            static_cast<uint8_t*>(p)[i] = v != 0.0;
            return;
        case DataType::kUInt8:
            static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
            return;
        case DataType::kInt8:
            static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
            return;
        case DataType::kInt32:
            static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
            return;
        case DataType::kInt64:
            static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
            return;
        case DataType::kFloat16:
            static_cast<uint16_t*>(p)[i] = DoubleToHalf(v);
            return;
        case DataType::kBFloat16:
            static_cast<uint16_t*>(p)[i] = FloatToBF16(static_cast<float>(v));
            return;
        case DataType::kFloat32:
            static_cast<float*>(p)[i] = static_cast<float>(v);
            return;
        case DataType::kFloat64:
            static_cast<double*>(p)[i] = v;
            return;
        case DataType::kFloat8E4M3:
            static_cast<uint8_t*>(p)[i] = FloatToFp8<false>(static_cast<float>(v));
            return;
        case DataType::kFloat8E5M2:
            static_cast<uint8_t*>(p)[i] = FloatToFp8<true>(static_cast<float>(v));
            return;
    }
}

void Convert(const Tensor& src, const Tensor& dst) {
    int64_t n = src.numel();
    if (src.dtype() == dst.dtype()) {
        if (n) std::memcpy(dst.data(), src.data(), src.nbytes());
        return;
    }
    const void* s = src.data();
    void* d = dst.data();
    DataType st = src.dtype(), dt = dst.dtype();
    if (st == DataType::kFloat32 && dt == DataType::kBFloat16) {
        ParallelFor(n, 2, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) static_cast<uint16_t*>(d)[i] = FloatToBF16(static_cast<const float*>(s)[i]);
        });
        return;
    }
    if (st == DataType::kBFloat16 && dt == DataType::kFloat32) {
        ParallelFor(n, 1, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) static_cast<float*>(d)[i] = BF16ToFloat(static_cast<const uint16_t*>(s)[i]);
        });
        return;
    }
    ParallelFor(n, 4, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) StoreAny(d, dt, i, LoadAny(s, st, i));
    });
}

void CastKernel(KernelContext& c) { Convert(c.in[0], c.out[0]); }
void CopyKernel(KernelContext& c) { Convert(c.in[1], c.in[0]); }

void FillKernel(KernelContext& c) {
    const Tensor& x = c.in[0];
    double v = c.f(0);
    DataType t = x.dtype();
    void* p = x.data();
    ParallelFor(x.numel(), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) StoreAny(p, t, i, v);
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "cast", CastKernel);
REGISTER_KERNEL(DeviceType::kCPU, "copy_", CopyKernel);
REGISTER_KERNEL(DeviceType::kCPU, "fill_", FillKernel);

}  // namespace infinitrain::cpu
