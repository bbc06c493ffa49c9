// Counter-based random kernels: normal_, uniform_ (in place), dropout and
// dropout_backward. Element i of a call with (seed, offset) depends only on
// (seed, offset + i), so results do not depend on the thread split, a tensor
// can be filled in pieces, and every device reproduces them.
//
// The exact formula (all integer arithmetic on uint64, wrapping mod 2^64;
// seed and offset are int64 attributes reinterpreted as uint64):
//
//   G          = 0x9E3779B97F4A7C15
//   mix64(z)   : z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//                z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
//   key_s      = mix64(seed + (s + 1) * G)            stream s = 0, 1, 2
//   bits_s(c)  = mix64(key_s + c * G)                 c = offset + i
//   u24_s(c)   = (bits_s(c) >> 40) * 2^-24            in [0, 1), exact in float32
//   u53_s(c)   = (bits_s(c) >> 11) * 2^-53            in [0, 1), exact in float64
//   u(c)       = u24_0(c) for float32 and bfloat16 tensors, u53_0(c) for float64
//
//   uniform_:  x[i] = low + (high - low) * u(c)
//   normal_:   z = sqrt(-2 ln(1 - u53_1(c))) * cos(2 pi u53_2(c));  x[i] = mean + std * z
//   dropout:   mask[i] = u(c) >= p;  out[i] = x[i] * (mask[i] ? 1 / (1 - p) : 0)
//   dropout_backward: dx[i] = grad[i] * (mask[i] ? 1 / (1 - p) : 0)
//
// Every right-hand side is evaluated in double (operations left to right, no
// fused multiply-add) and rounded once to the tensor's dtype, round to nearest
// even (bfloat16 straight from double, not through float32). uniform_, dropout
// and dropout_backward are therefore bit-exact on any IEEE device. normal_ also
// depends on the double log and cos, which math libraries may round differently
// in the last bit: float64 results agree to a few ulps, float32/bfloat16 ones
// almost always exactly (else by one ulp). Rounding can put uniform_ on `high`.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr double kTwoPi = 6.283185307179586476925286766559;

inline uint64_t Mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline uint64_t StreamKey(uint64_t seed, uint64_t stream) { return Mix64(seed + (stream + 1) * kGolden); }
inline uint64_t Bits(uint64_t key, uint64_t counter) { return Mix64(key + counter * kGolden); }
inline double U24(uint64_t bits) { return static_cast<double>(bits >> 40) * 0x1p-24; }
inline double U53(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1p-53; }

// The dtype's uniform: 24 bits for float32/bfloat16 tensors, 53 for float64.
template <typename T>
inline double Uniform(uint64_t key, uint64_t counter) {
    uint64_t b = Bits(key, counter);
    return std::is_same<T, double>::value ? U53(b) : U24(b);
}

template <typename T>
inline void StoreRounded(T* p, double v) {
    Store(p, static_cast<Acc<T>>(v));  // float32 or float64: one rounding
}
// bfloat16 from double: going through float rounds twice, which can miss the
// nearest bf16, so fix up the one case where that happens.
template <>
inline void StoreRounded<bf16>(bf16* p, double v) {
    float f = static_cast<float>(v);
    // float(v) rounds to nearest even; when it lands exactly on a bf16 halfway
    // point the tie must be broken by where v was, not by bf16's even rule.
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0xffffu) == 0x8000u && std::isfinite(f) && static_cast<double>(f) != v) {
        // v is just above or below the halfway point: nudge f one float ulp toward v.
        f = std::nextafter(f, v > static_cast<double>(f) ? INFINITY : -INFINITY);
    }
    p->bits = FloatToBF16(f);
}

// float16 from double: rounded once, directly.
template <>
inline void StoreRounded<f16>(f16* p, double v) {
    p->bits = DoubleToHalf(v);
}

// Attribute readers with a message naming the op (the schemas only check the count).
int64_t IntAttr(const KernelContext& c, size_t k, const char* op, const char* name) {
    if (const int64_t* p = std::get_if<int64_t>(&c.attrs[k])) return *p;
    OpError(op, std::string("attribute '") + name + "' must be an int");
}

double FloatAttr(const KernelContext& c, size_t k, const char* op, const char* name) {
    if (const int64_t* p = std::get_if<int64_t>(&c.attrs[k])) return static_cast<double>(*p);
    if (const double* p = std::get_if<double>(&c.attrs[k])) return *p;
    OpError(op, std::string("attribute '") + name + "' must be a float");
}

double DropoutScale(const char* op, double p) {
    if (!(p >= 0.0 && p < 1.0)) OpError(op, "p must be in [0, 1), got " + std::to_string(p));
    return 1.0 / (1.0 - p);
}

void UniformKernel(KernelContext& c) {
    const char* op = "uniform_";
    double low = FloatAttr(c, 0, op, "low"), high = FloatAttr(c, 1, op, "high");
    uint64_t key = StreamKey(static_cast<uint64_t>(IntAttr(c, 2, op, "seed")), 0);
    uint64_t offset = static_cast<uint64_t>(IntAttr(c, 3, op, "offset"));
    double range = high - low;
    DispatchFloat(c.in[0].dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        T* x = c.in[0].data<T>();
        ParallelFor(c.in[0].numel(), 4, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                double u = Uniform<T>(key, offset + static_cast<uint64_t>(i));
                StoreRounded(x + i, low + range * u);
            }
        });
    });
}

void NormalKernel(KernelContext& c) {
    const char* op = "normal_";
    double mean = FloatAttr(c, 0, op, "mean"), std = FloatAttr(c, 1, op, "std");
    uint64_t seed = static_cast<uint64_t>(IntAttr(c, 2, op, "seed"));
    uint64_t key1 = StreamKey(seed, 1), key2 = StreamKey(seed, 2);
    uint64_t offset = static_cast<uint64_t>(IntAttr(c, 3, op, "offset"));
    DispatchFloat(c.in[0].dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        T* x = c.in[0].data<T>();
        ParallelFor(c.in[0].numel(), 32, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                uint64_t ctr = offset + static_cast<uint64_t>(i);
                double a = 1.0 - U53(Bits(key1, ctr));  // (0, 1]: log stays finite
                double t = U53(Bits(key2, ctr));
                double z = std::sqrt(-2.0 * std::log(a)) * std::cos(kTwoPi * t);
                StoreRounded(x + i, mean + std * z);
            }
        });
    });
}

void DropoutKernel(KernelContext& c) {
    const char* op = "dropout";
    double p = FloatAttr(c, 0, op, "p");
    double scale = DropoutScale(op, p);
    uint64_t key = StreamKey(static_cast<uint64_t>(IntAttr(c, 1, op, "seed")), 0);
    uint64_t offset = static_cast<uint64_t>(IntAttr(c, 2, op, "offset"));
    DispatchFloat(c.in[0].dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        const T* x = c.in[0].data<T>();
        T* out = c.out[0].data<T>();
        uint8_t* mask = c.out[1].data<uint8_t>();
        ParallelFor(c.in[0].numel(), 4, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                bool keep = Uniform<T>(key, offset + static_cast<uint64_t>(i)) >= p;
                mask[i] = keep;
                StoreRounded(out + i, static_cast<double>(Load(x + i)) * (keep ? scale : 0.0));
            }
        });
    });
}

void DropoutBackwardKernel(KernelContext& c) {
    const char* op = "dropout_backward";
    double scale = DropoutScale(op, FloatAttr(c, 0, op, "p"));
    DispatchFloat(c.in[0].dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        const T* g = c.in[0].data<T>();
        const uint8_t* mask = c.in[1].data<uint8_t>();
        T* dx = c.out[0].data<T>();
        ParallelFor(c.in[0].numel(), 2, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                StoreRounded(dx + i, static_cast<double>(Load(g + i)) * (mask[i] ? scale : 0.0));
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "uniform_", UniformKernel);
REGISTER_KERNEL(DeviceType::kCPU, "normal_", NormalKernel);
REGISTER_KERNEL(DeviceType::kCPU, "dropout", DropoutKernel);
REGISTER_KERNEL(DeviceType::kCPU, "dropout_backward", DropoutBackwardKernel);

}  // namespace infinitrain::cpu
