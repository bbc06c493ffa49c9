// FP8 on the CPU: fp8_quantize (saturating float -> float8 with the amax of the input) and fp8_matmul (float8
// operands decoded to float32, one float32 GEMM, then the scales, bias and output rounding). The CPU has no FP8
// units; these are the reference the GPU kernels are tested against, and what --fp8 runs on the cpu.
#include "infinitrain/fp8.h"

#include <cmath>
#include <vector>

#include "infinitrain/kernels/cpu/blas.h"
#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

// max |x| over the whole tensor, NaN if any element is NaN; chunks fixed by n alone.
template <typename T>
float AbsMax(const T* x, int64_t n) {
    constexpr int64_t kChunk = 1 << 14;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<float> part(static_cast<size_t>(chunks), 0.0f);
    ParallelFor(chunks, kChunk, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
            float m = 0.0f;
            bool nan = false;
            for (int64_t i = c * kChunk, end = std::min(n, i + kChunk); i < end; ++i) {
                float v = std::fabs(static_cast<float>(Load(x + i)));
                nan |= v != v;
                m = v > m ? v : m;
            }
            part[c] = nan ? NAN : m;
        }
    });
    float m = 0.0f;
    for (float v : part) {
        if (v != v) return v;
        m = v > m ? v : m;
    }
    return m;
}

template <bool kE5M2, typename T>
void Quantize(const T* x, uint8_t* out, int64_t n, float scale) {
    ParallelFor(n, 4, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = QuantizeFp8<kE5M2>(static_cast<float>(Load(x + i)), scale);
    });
}

void Fp8QuantizeKernel(KernelContext& c) {
    const Tensor &x = c.in[0], &out = c.out[0];
    const float scale = *c.in[1].data<float>();
    const bool e5m2 = out.dtype() == DataType::kFloat8E5M2;
    DispatchFloat(x.dtype(), "fp8_quantize", [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.data<T>();
        uint8_t* op = out.data<uint8_t>();
        if (e5m2) {
            Quantize<true>(xp, op, x.numel(), scale);
        } else {
            Quantize<false>(xp, op, x.numel(), scale);
        }
        *c.out[1].data<float>() = AbsMax(xp, x.numel());
    });
}

std::vector<float> Decode(const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    const uint8_t* p = t.data<uint8_t>();
    const bool e5m2 = t.dtype() == DataType::kFloat8E5M2;
    ParallelFor(t.numel(), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = e5m2 ? Fp8ToFloat<true>(p[i]) : Fp8ToFloat<false>(p[i]);
    });
    return out;
}

void Fp8MatmulKernel(KernelContext& c) {
    const Tensor &a = c.in[0], &b = c.in[1], &out = c.out[0];
    const Tensor* bias = c.in.size() == 5 ? &c.in[4] : nullptr;
    const bool ta = c.i(0) != 0, tb = c.i(1) != 0;
    const int64_t m = out.size(0), n = out.size(1), k = ta ? a.size(0) : a.size(1);
    CheckBlasSize("fp8_matmul", {m, n, k});
    if (out.numel() == 0) return;
    // As the GPU applies them: one float32 factor on the float32 accumulator.
    const float scale = *c.in[2].data<float>() * *c.in[3].data<float>();
    std::vector<float> av = Decode(a), bv = Decode(b), acc(static_cast<size_t>(m * n));
    Gemm<float>(ta, tb, m, n, k, 1.0f, av.data(), bv.data(), 0.0f, acc.data());
    DispatchFloat(out.dtype(), "fp8_matmul", [&](auto tag) {
        using T = decltype(tag);
        T* op = out.data<T>();
        const T* bp = bias ? bias->data<T>() : nullptr;
        ParallelFor(m, n, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
                for (int64_t j = 0; j < n; ++j) {
                    float v = acc[r * n + j] * scale;
                    if (bp) v += static_cast<float>(Load(bp + j));
                    Store(op + r * n + j, v);
                }
            }
        });
    });
}

// Delayed scaling's update of one history row (fp8_amax_push_).
void PushAmax(const Tensor& hist, const Tensor& scale, int64_t row, float amax, double fmax, int64_t margin) {
    const int64_t h = hist.size(1);
    float* r = hist.data<float>() + row * h;
    for (int64_t j = h - 1; j > 0; --j) r[j] = r[j - 1];
    r[0] = amax;
    float m = 0.0f;
    bool nan = false;
    for (int64_t j = 0; j < h; ++j) {
        nan |= r[j] != r[j];
        m = r[j] > m ? r[j] : m;
    }
    if (!nan && m > 0.0f && std::isfinite(m)) {
        const float top = static_cast<float>(fmax / std::ldexp(1.0, static_cast<int>(margin)));
        scale.data<float>()[row] = top / m;
    }
}

void Fp8AmaxPushKernel(KernelContext& c) { PushAmax(c.in[0], c.in[1], c.i(0), *c.in[2].data<float>(), c.f(1), c.i(2)); }

void Fp8QuantizeDelayedKernel(KernelContext& c) {
    const Tensor &x = c.in[0], &hist = c.in[1], &scale = c.in[2];
    const int64_t row = c.i(0), rows = x.size(0), cols = x.size(1);
    const float s = scale.data<float>()[row];
    const bool e5m2 = c.out[0].dtype() == DataType::kFloat8E5M2;
    uint8_t* op = c.out[0].data<uint8_t>();
    float amax = 0.0f;
    DispatchFloat(x.dtype(), "fp8_quantize_delayed_", [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.data<T>();
        if (e5m2) {
            Quantize<true>(xp, op, x.numel(), s);
        } else {
            Quantize<false>(xp, op, x.numel(), s);
        }
        amax = AbsMax(xp, x.numel());
        if (c.i(4)) {
            float* sums = c.out[3].data<float>();
            ParallelFor(cols, rows, [&](int64_t j0, int64_t j1) {
                for (int64_t j = j0; j < j1; ++j) {
                    float acc = 0.0f;
                    for (int64_t r = 0; r < rows; ++r) acc += static_cast<float>(Load(xp + r * cols + j));
                    sums[j] = acc;
                }
            });
        }
    });
    if (c.i(3)) {
        uint8_t* tp = c.out[1].data<uint8_t>();
        ParallelFor(cols, rows, [&](int64_t j0, int64_t j1) {
            for (int64_t j = j0; j < j1; ++j) {
                for (int64_t r = 0; r < rows; ++r) tp[j * rows + r] = op[r * cols + j];
            }
        });
    }
    *c.out[2].data<float>() = 1.0f / s;
    if (c.i(5)) PushAmax(hist, scale, row, amax, e5m2 ? Fp8Format<true>::kMax : Fp8Format<false>::kMax, c.i(1));
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "fp8_amax_push_", Fp8AmaxPushKernel);
REGISTER_KERNEL(DeviceType::kCPU, "fp8_quantize", Fp8QuantizeKernel);
REGISTER_KERNEL(DeviceType::kCPU, "fp8_quantize_delayed_", Fp8QuantizeDelayedKernel);
REGISTER_KERNEL(DeviceType::kCPU, "fp8_matmul", Fp8MatmulKernel);

}  // namespace infinitrain::cpu
