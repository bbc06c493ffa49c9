// 8-bit floats (OCP FP8, as NVIDIA Hopper and PyTorch's float8 dtypes have them), converted to and from float32
// with integer operations only, so that the host, CUDA and any CUDA-dialect compiler compute the same bits.
//
//   e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, NaN = S.1111.111, max 448,
//           smallest subnormal 2^-9.
//   e5m2:   sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE infinities and NaNs, max 57344,
//           smallest subnormal 2^-16.
//
// FloatToFp8 rounds to nearest, ties to even, as a cast does (PyTorch's .to(float8_*)): a value past the largest
// finite one after rounding becomes NaN (e4m3fn) or infinity (e5m2). fp8_quantize saturates before it converts.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__MACACC__)
#define INFINITRAIN_HD __host__ __device__ __forceinline__
#else
#define INFINITRAIN_HD inline
#endif

namespace infinitrain {

// kE5M2 = false: e4m3fn.
template <bool kE5M2>
struct Fp8Format {
    static constexpr int kMantBits = kE5M2 ? 2 : 3;
    static constexpr int kBias = kE5M2 ? 15 : 7;
    static constexpr float kMax = kE5M2 ? 57344.0f : 448.0f;
};

INFINITRAIN_HD uint32_t Fp8FloatBits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}

INFINITRAIN_HD float Fp8BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

template <bool kE5M2>
INFINITRAIN_HD uint8_t FloatToFp8(float f) {
    using F = Fp8Format<kE5M2>;
    constexpr int M = F::kMantBits, B = F::kBias;
    const uint32_t x = Fp8FloatBits(f);
    const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
    if (a == 0x7f800000u) return static_cast<uint8_t>(sign | (kE5M2 ? 0x7cu : 0x7fu));
    int e = static_cast<int>(a >> 23) - 127;  // unbiased exponent of a normal float
    uint32_t mant = a & 0x7fffffu;
    if (e == -127) {
        e = -126;  // float subnormal: no implicit bit
    } else {
        mant |= 0x800000u;
    }
    // Keep the bits of the fp8 grid at this magnitude: shift = how many of the 24 float bits fall below its unit.
    int shift = e < 1 - B ? 23 - M + (1 - B - e) : 23 - M;
    if (shift > 25) return sign;  // below half the smallest subnormal
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    uint32_t code;
    if (e < 1 - B) {
        code = q;  // subnormal; q == 2^M carries into the smallest normal's exponent field by itself
    } else {
        // q holds the implicit bit at 2^M; rounding may carry it to 2^(M+1).
        int exp_field = e + B;
        if (q >> (M + 1)) {
            q >>= 1;
            ++exp_field;
        }
        if (exp_field > (kE5M2 ? 30 : 15)) return static_cast<uint8_t>(sign | (kE5M2 ? 0x7cu : 0x7fu));
        code = (static_cast<uint32_t>(exp_field) << M) | (q & ((1u << M) - 1u));
        if (!kE5M2 && code == 0x7fu) return static_cast<uint8_t>(sign | 0x7fu);  // 480 rounds to NaN
    }
    return static_cast<uint8_t>(sign | code);
}

template <bool kE5M2>
INFINITRAIN_HD float Fp8ToFloat(uint8_t v) {
    using F = Fp8Format<kE5M2>;
    constexpr int M = F::kMantBits, B = F::kBias;
    const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
    const uint32_t exp_field = (v & 0x7fu) >> M, mant = v & ((1u << M) - 1u);
    if (!kE5M2 && (v & 0x7fu) == 0x7fu) return Fp8BitsFloat(sign | 0x7fc00000u);
    if (kE5M2 && exp_field == 31) return Fp8BitsFloat(sign | (mant ? 0x7fc00000u : 0x7f800000u));
    if (exp_field == 0) {
        // mant * 2^(1 - B - M), exact in float.
        float m = static_cast<float>(mant) * Fp8BitsFloat(static_cast<uint32_t>(127 + 1 - B - M) << 23);
        return Fp8BitsFloat(Fp8FloatBits(m) | sign);
    }
    return Fp8BitsFloat(sign | ((exp_field - B + 127) << 23) | (mant << (23 - M)));
}

// Saturating quantization, as fp8_quantize does: x * scale clamped to the format's finite range, then rounded.
// NaN stays NaN.
template <bool kE5M2>
INFINITRAIN_HD uint8_t QuantizeFp8(float x, float scale) {
    constexpr float kMax = Fp8Format<kE5M2>::kMax;
    float v = x * scale;
    if (v > kMax) v = kMax;
    if (v < -kMax) v = -kMax;
    return FloatToFp8<kE5M2>(v);
}

}  // namespace infinitrain
