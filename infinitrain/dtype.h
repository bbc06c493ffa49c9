// Data types and host-side conversions for the 16-bit float storage types.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace infinitrain {

enum class DataType : int8_t {
    kBool,
    kUInt8,
    kInt8,
    kInt32,
    kInt64,
    kFloat16,
    kBFloat16,
    kFloat32,
    kFloat64,
    // 8-bit floats (OCP FP8): storage for FP8 GEMM operands. Only cast, fp8_quantize and fp8_matmul take them;
    // arithmetic ops do not (infinitrain/fp8.h has the conversions).
    kFloat8E4M3,  // float8_e4m3fn: 4 exponent bits, 3 mantissa bits, no infinities, max 448
    kFloat8E5M2,  // float8_e5m2: 5 exponent bits, 2 mantissa bits, IEEE-style infinities, max 57344
};

constexpr int kNumDataTypes = 11;

size_t DataTypeSize(DataType t);
const char* DataTypeName(DataType t);
// Accepts "float32", "bfloat16", ... and raises std::invalid_argument listing the names otherwise.
DataType ParseDataType(const std::string& name);
bool IsFloating(DataType t);  // the arithmetic floats: float16, bfloat16, float32, float64
inline bool IsFloat8(DataType t) { return t == DataType::kFloat8E4M3 || t == DataType::kFloat8E5M2; }

// bfloat16: the top half of a float32, rounded to nearest even.
inline uint16_t FloatToBF16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

inline float BF16ToFloat(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t FloatToHalf(float f);
// Rounds a double to the nearest float16 once (going through float would round twice).
uint16_t DoubleToHalf(double v);
float HalfToFloat(uint16_t h);

struct bf16 {
    uint16_t bits;
};

struct f16 {
    uint16_t bits;
};

}  // namespace infinitrain
