// Cross-entropy loss over rows of logits.
//   cross_entropy(logits [N, V], target int64 [N], ignore_index) -> loss (0-d), lse [N]:
//     one block per row (up to 1024 threads over a 50k vocabulary, 16-byte loads where the row allows): max, then
//     the sum of exp(x - max) (the row again, from cache), lse = max + log(sum);
//     the row's loss lse - logits[target] goes to a float64 scratch, and one block then sums the rows in a fixed
//     order: loss = total / count over rows with target != ignore_index (0 when every row is ignored).
//   cross_entropy_backward(logits, target, lse, grad (0-d)) -> dlogits [N, V]: one block counts the kept rows and
//     writes coef = grad / count (the count never leaves the device), then
//     dlogits[r, j] = coef * (exp(logits[r, j] - lse[r]) - onehot(target[r])), zero on ignored rows: a block per
//     row, 16-byte loads and stores where the row allows.
// Precision: max and exp in the compute type, the exp sum, the lse and the per-row losses in double; loss and lse
// are float32 (float64 for float64 logits); dlogits are rounded once to the logits' dtype. A target outside
// [0, V) that is not ignore_index is recorded in the device-error record and gives a NaN loss / gradient row.
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"
#include "backends/gpu/device_error.h"
#include "backends/gpu/map.cuh"

namespace infinitrain::gpu {

// Rows of kVec-element packs (kVec > 1 when V is a multiple of it and the logits are 16-byte aligned): each thread
// loads 16 bytes at a time. The sums are in double, so the order of the terms does not show in float32 results.
template <typename T, int kVec>
__global__ void CrossEntropyRowsKernel(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                       Acc<T>* __restrict__ lse_out, double* __restrict__ row_loss,
                                       double* __restrict__ row_kept, int64_t N, int64_t V, int64_t ignore,
                                       DeviceErrorRecord* err) {
    using S = Acc<T>;
    using P = Pack<T, kVec>;
    const int64_t packs = V / kVec;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        const T* row = logits + r * V;
        const P* prow = reinterpret_cast<const P*>(row);
        S mx = -INFINITY;
        for (int64_t u = threadIdx.x; u < packs; u += blockDim.x) {
            const P p = prow[u];
#pragma unroll
            for (int k = 0; k < kVec; ++k) mx = Fmax(mx, ToAcc(p.v[k]));
        }
        mx = BlockReduce(mx, FmaxOp(), S(-INFINITY));
        double sum = 0;
        for (int64_t u = threadIdx.x; u < packs; u += blockDim.x) {
            const P p = prow[u];
#pragma unroll
            for (int k = 0; k < kVec; ++k) sum += static_cast<double>(Exp(ToAcc(p.v[k]) - mx));
        }
        sum = BlockReduce(sum, SumOp(), 0.0);
        if (threadIdx.x == 0) {
            const double lse = static_cast<double>(mx) + log(sum);  // V == 0: -inf
            lse_out[r] = static_cast<S>(lse);
            const int64_t t = target[r];
            double loss = 0, kept = 1;
            if (t == ignore) {
                kept = 0;
            } else if (t < 0 || t >= V) {
                RecordIndexError(err, IndexErrorKind::kCrossEntropy, t, r, V, ignore);
                loss = NAN;
            } else {
                loss = lse - static_cast<double>(ToAcc(row[t]));
            }
            row_loss[r] = loss;
            row_kept[r] = kept;
        }
    }
}

// One block: loss = sum(row_loss) / sum(row_kept), or 0 when nothing is kept.
template <typename S>
__global__ void CrossEntropyLossKernel(const double* __restrict__ row_loss, const double* __restrict__ row_kept,
                                       int64_t N, S* __restrict__ loss) {
    double total = 0, count = 0;
    for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
        total += row_loss[r];
        count += row_kept[r];
    }
    total = BlockReduce(total, SumOp(), 0.0);
    count = BlockReduce(count, SumOp(), 0.0);
    if (threadIdx.x == 0) *loss = static_cast<S>(count > 0 ? total / count : 0.0);
}

// One block: coef = grad / count of kept rows (0 when none); bad targets are recorded.
template <typename S>
__global__ void CrossEntropyCoefKernel(const int64_t* __restrict__ target, const S* __restrict__ grad, int64_t N,
                                       int64_t V, int64_t ignore, double* __restrict__ coef, DeviceErrorRecord* err) {
    double count = 0;
    for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
        const int64_t t = target[r];
        if (t == ignore) continue;
        if (t < 0 || t >= V) RecordIndexError(err, IndexErrorKind::kCrossEntropyBackward, t, r, V, ignore);
        count += 1;
    }
    count = BlockReduce(count, SumOp(), 0.0);
    if (threadIdx.x == 0) *coef = count > 0 ? static_cast<double>(*grad) / count : 0.0;
}

// A block per row (grid-stride over rows), threads over its kVec-element packs.
template <typename T, int kVec>
__global__ void CrossEntropyBackwardKernel(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                           const Acc<T>* __restrict__ lse, const double* __restrict__ coef,
                                           T* __restrict__ dlogits, int64_t N, int64_t V, int64_t ignore) {
    using S = Acc<T>;
    using P = Pack<T, kVec>;
    const double c = *coef;
    const int64_t packs = V / kVec;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        const int64_t t = target[r];
        const double l = static_cast<double>(lse[r]);
        const bool ignored = t == ignore, bad = !ignored && (t < 0 || t >= V);
        const P* src = reinterpret_cast<const P*>(logits + r * V);
        P* dst = reinterpret_cast<P*>(dlogits + r * V);
        for (int64_t u = threadIdx.x; u < packs; u += blockDim.x) {
            const P p = src[u];
            P out;
#pragma unroll
            for (int k = 0; k < kVec; ++k) {
                S d;
                if (ignored) {
                    d = S(0);
                } else if (bad) {
                    d = S(NAN);
                } else {
                    // The CPU's order: the difference in double, rounded to S, then exp in S.
                    const double e = Exp(static_cast<S>(static_cast<double>(ToAcc(p.v[k])) - l));
                    d = static_cast<S>(c * (e - (u * kVec + k == t ? 1.0 : 0.0)));
                }
                out.v[k] = FromAcc<T>(d);
            }
            dst[u] = out;
        }
    }
}

}  // namespace infinitrain::gpu
