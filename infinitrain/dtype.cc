#include "infinitrain/dtype.h"

#include <cmath>
#include <stdexcept>

namespace infinitrain {
namespace {
constexpr const char* kNames[kNumDataTypes] = {"bool",    "uint8",         "int8",       "int32",
                                               "int64",   "float16",       "bfloat16",   "float32",
                                               "float64", "float8_e4m3fn", "float8_e5m2"};
constexpr size_t kSizes[kNumDataTypes] = {1, 1, 1, 4, 8, 2, 2, 4, 8, 1, 1};
}  // namespace

size_t DataTypeSize(DataType t) { return kSizes[static_cast<int>(t)]; }
const char* DataTypeName(DataType t) { return kNames[static_cast<int>(t)]; }

DataType ParseDataType(const std::string& name) {
    for (int i = 0; i < kNumDataTypes; ++i) {
        if (name == kNames[i]) return static_cast<DataType>(i);
    }
    std::string all;
    for (int i = 0; i < kNumDataTypes; ++i) all += std::string(i ? ", " : "") + kNames[i];
    throw std::invalid_argument("unknown dtype '" + name + "': expected one of " + all);
}

bool IsFloating(DataType t) {
    return t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat32 || t == DataType::kFloat64;
}

uint16_t FloatToHalf(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mant = x & 0x007fffffu;
    int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
    if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
    exp = exp - 127 + 15;
    if (exp >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return static_cast<uint16_t>(sign);
        mant |= 0x00800000u;
        uint32_t shift = static_cast<uint32_t>(14 - exp);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) ++half;
        return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(half);
}

uint16_t DoubleToHalf(double v) {
    if (std::isnan(v)) return FloatToHalf(static_cast<float>(v));
    uint16_t sign = std::signbit(v) ? 0x8000u : 0;
    if (std::fabs(v) >= 65520.0) return static_cast<uint16_t>(sign | 0x7c00u);  // at or past the overflow midpoint
    uint16_t h = FloatToHalf(static_cast<float>(v));
    double hv = HalfToFloat(h);
    if (hv == v) return h;
    // float(v) is within one half step of v: the answer is h or its neighbour toward v.
    uint16_t other = std::fabs(v) > std::fabs(hv) ? h + 1 : h - 1;
    double ov = HalfToFloat(other);
    double dh = std::fabs(v - hv), dother = std::fabs(v - ov);
    if (dother < dh || (dother == dh && (other & 1u) == 0)) return other;
    return h;
}

float HalfToFloat(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t out;
    if (exp == 0) {
        if (mant == 0) {
            out = sign;
        } else {
            exp = 127 - 15 + 1;
            while ((mant & 0x400u) == 0) {
                mant <<= 1;
                --exp;
            }
            out = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        out = sign | 0x7f800000u | (mant << 13);
    } else {
        out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &out, 4);
    return f;
}

}  // namespace infinitrain
