// exp for float that compilers vectorise (no libm call, no branches): the elementwise kernels' sigmoid, SiLU and
// tanh-GELU spend most of their time in expf, which libm evaluates one element at a time.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace infinitrain::cpu {

// e^x = 2^k e^r with k = round(x / ln 2), |r| <= ln(2) / 2 (Cody-Waite split of ln 2), e^r from Cephes' expf
// polynomial: within 2 ulp of the exact value. 2^k is applied in two halves, so that results in the subnormal
// range keep their precision and large ones overflow to inf. NaN passes through.
// always_inline: a call in a loop stops it vectorising, and GCC -O2 does not inline the larger callers itself.
#define INFINITRAIN_ALWAYS_INLINE inline __attribute__((always_inline))

// Loops built for AVX-512 and AVX2 besides the baseline (SSE2), picked when the library loads: without them the
// math functions vectorise only 4 wide (2 for double), and double division and sqrt are SSE2's.
#define INFINITRAIN_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

INFINITRAIN_ALWAYS_INLINE float ExpF(float x) {
    float xc = x < -104.0f ? -104.0f : x;  // below: 0 (exp(-104) < the smallest subnormal)
    xc = xc > 89.0f ? 89.0f : xc;          // above: inf
    // Round to nearest by adding and removing 1.5 * 2^23 (|x / ln 2| < 2^22 here); std::floor is a libm call.
    float k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t ki = static_cast<int32_t>(k);
    int32_t k1 = ki / 2, k2 = ki - k1;
    int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
    float s1, s2;
    std::memcpy(&s1, &b1, sizeof s1);
    std::memcpy(&s2, &b2, sizeof s2);
    return y * s1 * s2;  // NaN: the clamps keep it, so r and y are NaN
}

// erfc(z) for z >= 0 as t e^(-z^2 + P(t)), t = 1 / (1 + z/2), with the published Chebyshev fit P of degree 9
// (fractional error below 1.2e-7 on all of z >= 0, so the tail keeps its relative accuracy); on ExpF, so it
// vectorises. erfc(inf) = 0, NaN passes through.
INFINITRAIN_ALWAYS_INLINE float ErfcNonNegF(float z) {
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    return t * ExpF(p - z * z);
}

// erf(x): the odd Taylor series through x^13 below |x| = 0.5 (relative error under 3e-8 there, where 1 - erfc
// would cancel), 1 - erfc(|x|) above, with x's sign.
INFINITRAIN_ALWAYS_INLINE float ErfF(float x) {
    float a = std::fabs(x);
    float s = a * a;
    float p = 1.0f / 9360.0f;
    p = p * s - 1.0f / 1320.0f;
    p = p * s + 1.0f / 216.0f;
    p = p * s - 1.0f / 42.0f;
    p = p * s + 1.0f / 10.0f;
    p = p * s - 1.0f / 3.0f;
    p = p * s + 1.0f;
    float small = 1.1283791670955126f * a * p;  // 2 / sqrt(pi)
    float r = a < 0.5f ? small : 1.0f - ErfcNonNegF(a);
    return x < 0.0f ? -r : r;  // NaN: r is NaN
}

// The standard normal CDF, Phi(x) = erfc(-x / sqrt 2) / 2, from the tail on both sides (relative accuracy in the
// left tail, where GELU's x Phi(x) is small).
INFINITRAIN_ALWAYS_INLINE float NormalCdfF(float x) {
    float h = 0.5f * ErfcNonNegF(std::fabs(x) * 0.70710678118654752f);
    return x < 0.0f ? h : 1.0f - h;
}

// exp in a kernel's compute type: ExpF for float (bfloat16, float16), libm for double.
INFINITRAIN_ALWAYS_INLINE float Exp(float x) { return ExpF(x); }
INFINITRAIN_ALWAYS_INLINE double Exp(double x) { return std::exp(x); }

}  // namespace infinitrain::cpu
