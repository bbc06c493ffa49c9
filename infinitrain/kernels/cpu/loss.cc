// Cross-entropy loss over rows of logits.
//   cross_entropy(logits [N, V], target int64 [N], ignore_index) -> loss (0-d), lse [N]:
//     lse[r] = log sum_j exp(logits[r, j]); loss = mean over rows with target != ignore_index of
//     lse[r] - logits[r, target[r]] (0 when every row is ignored).
//   cross_entropy_backward(logits, target, lse, grad (0-d), ignore_index) -> dlogits [N, V]:
//     dlogits[r] = grad * (softmax(logits[r]) - onehot(target[r])) / count, zero rows where the target is ignored.
// loss and lse are float32, or float64 for float64 logits. Sums accumulate in double; the row loop runs in parallel
// and the loss adds per-thread partial sums in thread order.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "infinitrain/kernels/cpu/common.h"
#include "infinitrain/kernels/cpu/fastmath.h"

namespace infinitrain::cpu {
namespace {

DataType StatDtype(DataType t) { return t == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32; }

// Rows whose target counts; out-of-range targets raise std::out_of_range naming the value and the valid range.
int64_t CountTargets(const char* op, const Tensor& target, int64_t vocab, int64_t ignore) {
    const int64_t* tp = target.data<int64_t>();
    int64_t count = 0;
    for (int64_t r = 0; r < target.numel(); ++r) {
        int64_t t = tp[r];
        if (t == ignore) continue;
        if (t < 0 || t >= vocab) {
            throw std::out_of_range(std::string(op) + ": target " + std::to_string(t) + " at row " + std::to_string(r) +
                                    " is out of range [0, " + std::to_string(vocab) + ") (ignore_index " +
                                    std::to_string(ignore) + ")");
        }
        ++count;
    }
    return count;
}

void CrossEntropyKernel(KernelContext& ctx) {
    const Tensor &logits = ctx.in[0], &target = ctx.in[1];
    const Tensor &loss_t = ctx.out[0], &lse_t = ctx.out[1];
    int64_t ignore = ctx.i(0), n = logits.size(0), vocab = logits.size(1);
    int64_t count = CountTargets("cross_entropy", target, vocab, ignore);
    DispatchFloat(logits.dtype(), "cross_entropy", [&](auto tag) {
        using T = decltype(tag);
        using S = Acc<T>;
        const T* xp = logits.data<T>();
        const int64_t* tp = target.data<int64_t>();
        S* lp = lse_t.data<S>();
        std::vector<double> partial(omp_get_max_threads(), 0.0);
        ParallelFor(n, vocab * 4, [&](int64_t b, int64_t e) {
            double acc = 0;
            for (int64_t r = b; r < e; ++r) {
                const T* row = xp + r * vocab;
                double lse = -INFINITY;  // empty rows (V = 0): log(0)
                if (vocab > 0) {
                    S mx = -INFINITY;
                    // A compare, not std::fmax (a libm call per element here); NaN is skipped either way.
#pragma omp simd reduction(max : mx)
                    for (int64_t j = 0; j < vocab; ++j) {
                        S v = Load(row + j);
                        mx = v > mx ? v : mx;
                    }
                    // exp in the compute type a block at a time, summed in double: mixed widths in one loop do not
                    // vectorise.
                    double sum = 0;
                    S buf[256];
                    for (int64_t j0 = 0; j0 < vocab; j0 += 256) {
                        int64_t m = std::min<int64_t>(256, vocab - j0);
#pragma omp simd
                        for (int64_t j = 0; j < m; ++j) buf[j] = Exp(Load(row + j0 + j) - mx);
#pragma omp simd reduction(+ : sum)
                        for (int64_t j = 0; j < m; ++j) sum += buf[j];
                    }
                    lse = mx + std::log(sum);
                }
                lp[r] = static_cast<S>(lse);
                if (tp[r] != ignore) acc += lse - Load(row + tp[r]);
            }
            partial[omp_get_thread_num()] += acc;
        });
        double total = 0;
        for (double p : partial) total += p;
        *loss_t.data<S>() = static_cast<S>(count ? total / count : 0.0);
    });
}

double LoadScalar(const Tensor& t) {
    switch (t.dtype()) {
        case DataType::kFloat32:
            return *t.data<float>();
        case DataType::kFloat64:
            return *t.data<double>();
        case DataType::kBFloat16:
            return Load(t.data<bf16>());
        case DataType::kFloat16:
            return Load(t.data<f16>());
        default:
            OpError("cross_entropy_backward",
                    std::string("grad must be a float tensor, got ") + DataTypeName(t.dtype()));
    }
}

void CrossEntropyBackwardKernel(KernelContext& ctx) {
    const char* op = "cross_entropy_backward";
    const Tensor &logits = ctx.in[0], &target = ctx.in[1], &lse_t = ctx.in[2], &grad_t = ctx.in[3];
    const Tensor& dx = ctx.out[0];
    // The meta only checks the logits and the attribute count; check the rest before reading them.
    if (!std::holds_alternative<int64_t>(ctx.attrs[0])) OpError(op, "attribute 'ignore_index' must be an int");
    if (logits.dim() != 2) OpError(op, "logits must be 2-d, got shape " + ShapeToString(logits.shape()));
    int64_t ignore = ctx.i(0), n = logits.size(0), vocab = logits.size(1);
    DataType st = StatDtype(logits.dtype());
    if (target.dtype() != DataType::kInt64 || target.shape() != Shape{n}) {
        OpError(op, "target must be int64[" + std::to_string(n) + "], got " + DataTypeName(target.dtype()) +
                        ShapeToString(target.shape()));
    }
    if (lse_t.dtype() != st || lse_t.shape() != Shape{n}) {
        OpError(op, std::string("lse must be ") + DataTypeName(st) + "[" + std::to_string(n) + "], got " +
                        DataTypeName(lse_t.dtype()) + ShapeToString(lse_t.shape()));
    }
    if (grad_t.numel() != 1) OpError(op, "grad must hold one value, got shape " + ShapeToString(grad_t.shape()));
    double grad = LoadScalar(grad_t);
    int64_t count = CountTargets(op, target, vocab, ignore);
    double coef = count ? grad / count : 0.0;
    DispatchFloat(logits.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        using S = Acc<T>;
        const T* xp = logits.data<T>();
        const int64_t* tp = target.data<int64_t>();
        const S* lp = lse_t.data<S>();
        T* dp = dx.data<T>();
        ParallelFor(n, vocab * 4, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
                const T* row = xp + r * vocab;
                T* drow = dp + r * vocab;
                if (tp[r] == ignore) {
                    for (int64_t j = 0; j < vocab; ++j) Store(drow + j, S(0));
                    continue;
                }
                const S lse = lp[r], c = static_cast<S>(coef);
#pragma omp simd
                for (int64_t j = 0; j < vocab; ++j) Store(drow + j, c * Exp(static_cast<S>(Load(row + j) - lse)));
                // The target's element again, with its -1 before rounding to T.
                Store(drow + tp[r], c * (Exp(static_cast<S>(Load(row + tp[r]) - lse)) - S(1)));
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "cross_entropy", CrossEntropyKernel);
REGISTER_KERNEL(DeviceType::kCPU, "cross_entropy_backward", CrossEntropyBackwardKernel);

}  // namespace infinitrain::cpu
