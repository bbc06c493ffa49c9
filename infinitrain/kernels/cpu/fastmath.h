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

// exp in a kernel's compute type: ExpF for float (bfloat16, float16), libm for double.
INFINITRAIN_ALWAYS_INLINE float Exp(float x) { return ExpF(x); }
INFINITRAIN_ALWAYS_INLINE double Exp(double x) { return std::exp(x); }

}  // namespace infinitrain::cpu
