// Counter-based random kernels: uniform_, normal_ (in place), dropout and
// dropout_backward, bit for bit the formula at the top of
// infinitrain/kernels/cpu/random.cc: element i of a call with (seed, offset)
// uses the counter c = offset + i (uint64, wrapping), so results do not depend
// on the launch geometry or the device.
//
// Precision: every right-hand side is evaluated in double with explicitly
// rounded adds and multiplies (__dadd_rn, __dmul_rn: no fused multiply-add,
// whatever the compiler's contraction setting) and rounded once to the dtype.
// uniform_, dropout and dropout_backward are therefore bit-exact against the
// CPU; normal_ also uses the device's double log and cos, which may differ
// from the host libm in the last bit (as the CPU's comment allows).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr double kTwoPi = 6.283185307179586476925286766559;

__host__ __device__ __forceinline__ uint64_t Mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// key_s = mix64(seed + (s + 1) * G), computed on the host.
inline uint64_t StreamKey(uint64_t seed, uint64_t stream) { return Mix64(seed + (stream + 1) * kGolden); }

__device__ __forceinline__ uint64_t RandomBits(uint64_t key, uint64_t counter) {
    return Mix64(key + counter * kGolden);
}
__device__ __forceinline__ double U24(uint64_t bits) { return static_cast<double>(bits >> 40) * 0x1p-24; }
__device__ __forceinline__ double U53(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1p-53; }

// The dtype's uniform: 53 bits for float64 tensors, 24 for the others.
template <typename T>
__device__ __forceinline__ double UniformOf(uint64_t key, uint64_t counter) {
    const uint64_t b = RandomBits(key, counter);
    return std::is_same<T, double>::value ? U53(b) : U24(b);
}

template <typename T>
__global__ void UniformKernel(T* __restrict__ x, int64_t n, uint64_t key, uint64_t offset, double low, double range) {
    GPU_KERNEL_LOOP(i, n) {
        const double u = UniformOf<T>(key, offset + static_cast<uint64_t>(i));
        x[i] = FromDoubleOnce<T>(__dadd_rn(low, __dmul_rn(range, u)));
    }
}

template <typename T>
__global__ void NormalKernel(T* __restrict__ x, int64_t n, uint64_t key1, uint64_t key2, uint64_t offset, double mean,
                             double stddev) {
    GPU_KERNEL_LOOP(i, n) {
        const uint64_t c = offset + static_cast<uint64_t>(i);
        const double a = __dsub_rn(1.0, U53(RandomBits(key1, c)));  // (0, 1]: the log stays finite
        const double t = U53(RandomBits(key2, c));
        const double z = __dmul_rn(sqrt(__dmul_rn(-2.0, log(a))), cos(__dmul_rn(kTwoPi, t)));
        x[i] = FromDoubleOnce<T>(__dadd_rn(mean, __dmul_rn(stddev, z)));
    }
}

template <typename T>
__global__ void DropoutKernel(const T* __restrict__ x, T* __restrict__ out, uint8_t* __restrict__ mask, int64_t n,
                              uint64_t key, uint64_t offset, double p, double scale) {
    GPU_KERNEL_LOOP(i, n) {
        const bool keep = UniformOf<T>(key, offset + static_cast<uint64_t>(i)) >= p;
        mask[i] = keep;
        out[i] = FromDoubleOnce<T>(__dmul_rn(static_cast<double>(ToAcc(x[i])), keep ? scale : 0.0));
    }
}

template <typename T>
__global__ void DropoutBackwardKernel(const T* __restrict__ g, const uint8_t* __restrict__ mask, T* __restrict__ dx,
                                      int64_t n, double scale) {
    GPU_KERNEL_LOOP(i, n) {
        dx[i] = FromDoubleOnce<T>(__dmul_rn(static_cast<double>(ToAcc(g[i])), mask[i] ? scale : 0.0));
    }
}

}  // namespace infinitrain::gpu
