// Reductions: sum, mean, amax over a set of dims, argmax along one dim, and
// sum_squares over everything (foreach_sum_squares: over several tensors).
//
// Layout: x is contiguous row-major. Size-1 dims are dropped and adjacent dims
// that are both reduced or both kept are merged, leaving alternating groups
// such as [K0, R0, K1, R1, K2]. Each reduced group is then one pass over an
// (outer, R, inner) view, last reduced group first, so the pass's inner part
// is all kept dims; later passes read the previous pass's float64 result.
// All accumulation is in double (float32/bf16 values are exact in double),
// and the result is rounded to the output dtype once at the end. The output
// layout does not depend on keepdim: kept size-1 dims change no offsets.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "infinitrain/kernels/cpu/common.h"
#include "infinitrain/kernels/cpu/fastmath.h"

namespace infinitrain::cpu {
namespace {

inline double LoadD(const float* p) { return *p; }
inline double LoadD(const double* p) { return *p; }
inline double LoadD(const bf16* p) { return BF16ToFloat(p->bits); }
inline double LoadD(const f16* p) { return HalfToFloat(p->bits); }

enum class RedKind { kSum, kMax };

inline double Combine(RedKind k, double a, double v) {
    if (k == RedKind::kSum) return a + v;
    // NaN wins: once a is NaN, v > a is false and a stays NaN.
    return (v > a || std::isnan(v)) ? v : a;
}

inline double Identity(RedKind k) { return k == RedKind::kSum ? 0.0 : -std::numeric_limits<double>::infinity(); }

// Columns of `inner` handled by one task; keeps the per-task accumulator on the stack.
constexpr int64_t kColChunk = 256;
// Reduced rows per task when the reduction is split to give threads work.
constexpr int64_t kRowChunk = 8192;

// acc[j] += x[r * stride + j] (sum) or the NaN-keeping max, for r < n and j < cw: column sums in double, built
// for AVX-512 and AVX2 besides the baseline (fastmath.h), where SSE2 adds two doubles at a time. Each column adds
// its rows in order, so every build gives the same sums.
template <typename T>
INFINITRAIN_SIMD_CLONES void SumRows(const T* x, int64_t n, int64_t stride, int64_t cw, double* acc) {
    for (int64_t r = 0; r < n; ++r) {
        const T* row = x + r * stride;
#pragma omp simd
        for (int64_t j = 0; j < cw; ++j) acc[j] += LoadD(row + j);
    }
}

template <typename T>
INFINITRAIN_SIMD_CLONES void MaxRows(const T* x, int64_t n, int64_t stride, int64_t cw, double* acc) {
    for (int64_t r = 0; r < n; ++r) {
        const T* row = x + r * stride;
        for (int64_t j = 0; j < cw; ++j) acc[j] = Combine(RedKind::kMax, acc[j], LoadD(row + j));
    }
}

// out[o, i] = reduce over r of x[o, r, i], written as double. When there are
// few (outer, column-chunk) tasks but R is long, R is cut into fixed pieces
// whose partial results are combined in order, so results do not depend on
// the thread count.
template <typename T>
void ReducePass(const T* x, double* out, int64_t outer, int64_t R, int64_t inner, RedKind kind) {
    const int64_t K = std::min(inner, kColChunk);
    const int64_t nc = (inner + K - 1) / K;
    const int64_t tasks = outer * nc;
    int64_t pieces = 1;
    if (tasks < 64 && R >= 2 * kRowChunk) pieces = std::min<int64_t>((R + kRowChunk - 1) / kRowChunk, 256);
    const int64_t rlen = (R + pieces - 1) / pieces;
    const int64_t nout = outer * inner;
    std::vector<double> partial(pieces > 1 ? pieces * nout : 0);
    double* dst = pieces > 1 ? partial.data() : out;

    ParallelFor(tasks * pieces, rlen * K, [&](int64_t b, int64_t e) {
        double acc[kColChunk];
        for (int64_t t = b; t < e; ++t) {
            int64_t p = t / tasks, o = (t % tasks) / nc, c = t % nc;
            int64_t c0 = c * K, cw = std::min(K, inner - c0);
            int64_t r0 = p * rlen, r1 = std::min(R, r0 + rlen);
            for (int64_t j = 0; j < cw; ++j) acc[j] = Identity(kind);
            const T* rows = x + (o * R + r0) * inner + c0;
            if (kind == RedKind::kSum) {
                SumRows(rows, r1 - r0, inner, cw, acc);
            } else {
                MaxRows(rows, r1 - r0, inner, cw, acc);
            }
            double* d = dst + p * nout + o * inner + c0;
            for (int64_t j = 0; j < cw; ++j) d[j] = acc[j];
        }
    });
    if (pieces > 1) {
        ParallelFor(nout, pieces, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                double a = partial[i];
                for (int64_t p = 1; p < pieces; ++p) a = Combine(kind, a, partial[p * nout + i]);
                out[i] = a;
            }
        });
    }
}

struct Group {
    int64_t size;
    bool reduced;
};

// Drops size-1 dims and merges neighbours of the same kind. Sizes must be >= 1.
std::vector<Group> Coalesce(const Shape& s, const std::vector<bool>& reduce) {
    std::vector<Group> g;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == 1) continue;
        if (!g.empty() && g.back().reduced == reduce[i]) {
            g.back().size *= s[i];
        } else {
            g.push_back({s[i], static_cast<bool>(reduce[i])});
        }
    }
    return g;
}

void ReduceDims(KernelContext& c, RedKind kind, bool mean, const char* op) {
    const Tensor& x = c.in[0];
    Tensor& y = c.out[0];
    const auto& dims = c.ints(0);
    const int64_t nd = x.dim();
    std::vector<bool> reduce(nd, dims.empty());
    for (int64_t d : dims) reduce[NormalizeDim(op, d, nd)] = true;
    int64_t count = 1;  // elements folded into each output
    for (int64_t i = 0; i < nd; ++i) {
        if (reduce[i]) count *= x.shape()[i];
    }
    const int64_t nout = y.numel();

    DispatchFloat(x.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        T* yp = y.data<T>();
        if (nout == 0) return;
        if (x.numel() == 0) {
            // Reducing over an empty set: sum is 0, mean is 0/0 = NaN (amax is rejected by meta).
            double v = mean ? std::numeric_limits<double>::quiet_NaN() : 0.0;
            for (int64_t i = 0; i < nout; ++i) Store(yp + i, static_cast<Acc<T>>(v));
            return;
        }
        std::vector<Group> g = Coalesce(x.shape(), reduce);
        std::vector<double> cur, next;
        bool first = true;
        const T* xp = x.data<T>();
        while (true) {
            int64_t last = -1;
            for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
                if (g[i].reduced) last = i;
            }
            if (last < 0) break;
            int64_t outer = 1, inner = 1;
            for (int64_t i = 0; i < last; ++i) outer *= g[i].size;
            for (size_t i = last + 1; i < g.size(); ++i) inner *= g[i].size;
            next.assign(outer * inner, 0.0);
            if (first) {
                ReducePass(xp, next.data(), outer, g[last].size, inner, kind);
            } else {
                ReducePass(cur.data(), next.data(), outer, g[last].size, inner, kind);
            }
            first = false;
            cur.swap(next);
            // Remove the group; merge the kept neighbours it separated.
            g.erase(g.begin() + last);
            if (last > 0 && last < static_cast<int64_t>(g.size()) && !g[last - 1].reduced && !g[last].reduced) {
                g[last - 1].size *= g[last].size;
                g.erase(g.begin() + last);
            }
        }
        const double scale = mean ? 1.0 / static_cast<double>(count) : 1.0;
        ParallelFor(nout, 2, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                double v = first ? LoadD(xp + i) : cur[i];  // first: nothing reduced (only size-1 dims)
                Store(yp + i, static_cast<Acc<T>>(mean ? v * scale : v));
            }
        });
    });
}

void SumKernel(KernelContext& c) { ReduceDims(c, RedKind::kSum, false, "sum"); }
void MeanKernel(KernelContext& c) { ReduceDims(c, RedKind::kSum, true, "mean"); }
void AmaxKernel(KernelContext& c) { ReduceDims(c, RedKind::kMax, false, "amax"); }

// argmax over an (outer, R, inner) view: the first maximum wins, and the first
// NaN counts as the maximum (as in NumPy and PyTorch).
void ArgmaxKernel(KernelContext& c) {
    const Tensor& x = c.in[0];
    int64_t* yp = c.out[0].data<int64_t>();
    const int64_t d = NormalizeDim("argmax", c.i(0), x.dim());
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i) outer *= x.shape()[i];
    for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.shape()[i];
    const int64_t R = x.shape()[d];
    DispatchFloat(x.dtype(), "argmax", [&](auto tag) {
        using T = decltype(tag);
        if (c.out[0].numel() == 0) return;
        const T* xp = x.data<T>();
        const int64_t K = std::min(inner, kColChunk), nc = (inner + K - 1) / K;
        ParallelFor(outer * nc, R * K, [&](int64_t b, int64_t e) {
            double best[kColChunk];
            int64_t idx[kColChunk];
            for (int64_t t = b; t < e; ++t) {
                int64_t o = t / nc, c0 = (t % nc) * K, cw = std::min(K, inner - c0);
                const T* base = xp + o * R * inner + c0;
                for (int64_t j = 0; j < cw; ++j) {
                    best[j] = LoadD(base + j);
                    idx[j] = 0;
                }
                for (int64_t r = 1; r < R; ++r) {
                    const T* row = base + r * inner;
                    for (int64_t j = 0; j < cw; ++j) {
                        double v = LoadD(row + j);
                        if (!std::isnan(best[j]) && (v > best[j] || std::isnan(v))) {
                            best[j] = v;
                            idx[j] = r;
                        }
                    }
                }
                for (int64_t j = 0; j < cw; ++j) yp[o * inner + c0 + j] = idx[j];
            }
        });
    });
}

// sum of x^2 over all elements into a 0-d float32 (float64 for float64 x).
// Fixed-size chunks give per-chunk double partials summed in order, so the
// result does not depend on the thread count.
constexpr int64_t kSquaresChunk = 1 << 14;

template <typename T>
INFINITRAIN_SIMD_CLONES __attribute__((optimize("fp-contract=off"))) double SumSquaresRange(const T* x, int64_t b,
                                                                                            int64_t e) {
    // 16 running sums, element i into sum (i - b) % 16, combined in a fixed order: one running sum made the loop
    // wait on each add, and the lanes are explicit so that every build (SSE2, AVX2, AVX-512) gives the same bits.
    constexpr int kLanes = 16;
    double s[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes) {
#pragma omp simd
        for (int j = 0; j < kLanes; ++j) {
            double v = LoadD(x + i + j);
            s[j] += v * v;
        }
    }
    for (int j = 0; i < e; ++i, ++j) {
        double v = LoadD(x + i);
        s[j] += v * v;
    }
    for (int w = kLanes / 2; w > 0; w /= 2) {
        for (int j = 0; j < w; ++j) s[j] += s[j + w];
    }
    return s[0];
}

void StoreSumSquares(const std::vector<double>& part, Tensor& y) {
    double total = 0.0;
    for (double p : part) total += p;
    if (y.dtype() == DataType::kFloat64) {
        *y.data<double>() = total;
    } else {
        *y.data<float>() = static_cast<float>(total);
    }
}

void SumSquaresKernel(KernelContext& c) {
    const Tensor& x = c.in[0];
    const int64_t n = x.numel();
    const int64_t nchunks = (n + kSquaresChunk - 1) / kSquaresChunk;
    std::vector<double> part(nchunks, 0.0);
    DispatchFloat(x.dtype(), "sum_squares", [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.data<T>();
        ParallelFor(nchunks, kSquaresChunk, [&](int64_t b, int64_t e) {
            for (int64_t k = b; k < e; ++k) {
                part[k] = SumSquaresRange(xp, k * kSquaresChunk, std::min(n, (k + 1) * kSquaresChunk));
            }
        });
    });
    StoreSumSquares(part, c.out[0]);
}

// foreach_sum_squares: sum_squares's chunks of every input in turn (ForeachPieces), their partials summed in that
// order, so one input gives sum_squares's result bit for bit.
void ForeachSumSquaresKernel(KernelContext& c) {
    const std::vector<ForeachPiece> pieces = ForeachPieces(c.in, 0, c.in.size(), kSquaresChunk);
    const int64_t np = static_cast<int64_t>(pieces.size());
    std::vector<double> part(np, 0.0);
    DispatchFloat(c.in[0].dtype(), "foreach_sum_squares", [&](auto tag) {
        using T = decltype(tag);
        std::vector<const T*> xs;
        for (const Tensor& x : c.in) xs.push_back(x.data<T>());
        ParallelFor(np, kSquaresChunk, [&](int64_t b, int64_t e) {
            for (int64_t k = b; k < e; ++k) {
                const ForeachPiece& p = pieces[k];
                part[k] = SumSquaresRange(xs[p.t], p.begin, p.end);
            }
        });
    });
    StoreSumSquares(part, c.out[0]);
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "sum", SumKernel);
REGISTER_KERNEL(DeviceType::kCPU, "mean", MeanKernel);
REGISTER_KERNEL(DeviceType::kCPU, "amax", AmaxKernel);
REGISTER_KERNEL(DeviceType::kCPU, "argmax", ArgmaxKernel);
REGISTER_KERNEL(DeviceType::kCPU, "sum_squares", SumSquaresKernel);
REGISTER_KERNEL(DeviceType::kCPU, "foreach_sum_squares", ForeachSumSquaresKernel);

}  // namespace infinitrain::cpu
