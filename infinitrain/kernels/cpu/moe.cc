// Mixture-of-experts routing: top-k gating and dropless dispatch / combine.
//   moe_topk(logits [N, E]; k, normalize) -> weights [N, k] (float32, float64 for float64), experts [N, k] int64:
//     the k largest logits of each row, descending, ties to the lower expert; weights are their softmax
//     probabilities over all E, or a softmax over the chosen k (= probabilities renormalised) when normalize=1.
//   moe_topk_backward(logits, experts, grad; normalize) -> dlogits [N, E]:
//     normalize=1: w = softmax(chosen logits), dl[e_j] += w_j (g_j - sum g w);
//     normalize=0: p = softmax(row), dl = p * (dp - sum_j g_j p[e_j]) with dp the grads scattered to their experts.
//   moe_permute(x [N, C], experts [N, k]; E) -> out [N*k, C], source [N*k], counts [E]: a stable counting sort of the
//     N*k slots s = n*k + j by expert; row r of out is x[source[r] / k]. No capacity: every slot gets a row.
//   moe_unpermute(y [N*k, C], source, weights [N, k]) -> out [N, C]: out[n] = sum_j weights[n, j] * y[pos[n*k + j]]
//     with pos the inverse of source. moe_unpermute_backward: dy[r] = weights[s] * grad[s / k],
//     dweights[s] = grad[s / k] . y[r], s = source[r].
// Indices are validated serially before any parallel region; scratch is allocated outside it, so nothing throws
// inside OpenMP. Sums accumulate in double and each output element is written by one thread: results do not depend
// on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

inline double LoadD(const float* p) { return *p; }
inline double LoadD(const double* p) { return *p; }
inline double LoadD(const bf16* p) { return BF16ToFloat(p->bits); }
inline double LoadD(const f16* p) { return HalfToFloat(p->bits); }

void CheckExperts(const char* op, const Tensor& experts, int64_t num_experts) {
    const int64_t* e = experts.data<int64_t>();
    for (int64_t i = 0; i < experts.numel(); ++i) {
        if (e[i] < 0 || e[i] >= num_experts) {
            throw std::out_of_range(std::string(op) + ": expert " + std::to_string(e[i]) + " at slot " +
                                    std::to_string(i) + " out of range (expected 0 <= expert < " +
                                    std::to_string(num_experts) + ")");
        }
    }
}

// pos[s] = the row r with source[r] = s; raises unless source is a permutation of [0, n).
std::vector<int64_t> InversePermutation(const char* op, const Tensor& source) {
    const int64_t n = source.numel();
    const int64_t* src = source.data<int64_t>();
    std::vector<int64_t> pos(n, -1);
    for (int64_t r = 0; r < n; ++r) {
        int64_t s = src[r];
        if (s < 0 || s >= n || pos[s] != -1) {
            throw std::invalid_argument(std::string(op) + ": source must be a permutation of [0, " + std::to_string(n) +
                                        "), got " + std::to_string(s) + " at row " + std::to_string(r));
        }
        pos[s] = r;
    }
    return pos;
}

void MoeTopkKernel(KernelContext& ctx) {
    const Tensor& logits = ctx.in[0];
    const int64_t k = ctx.i(0);
    const bool normalize = ctx.i(1) != 0;
    const int64_t n = logits.size(0), E = logits.size(1);
    int64_t* ep = ctx.out[1].data<int64_t>();
    DispatchFloat(logits.dtype(), "moe_topk", [&](auto tag) {
        using T = decltype(tag);
        using S = Acc<T>;
        const T* xp = logits.data<T>();
        S* wp = ctx.out[0].data<S>();
        ParallelFor(n, E * (k + 2), [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
                const T* row = xp + r * E;
                int64_t* chosen = ep + r * k;
                // Selection by repeated scans (k is small): the first untaken index wins ties.
                for (int64_t j = 0; j < k; ++j) {
                    int64_t best = -1;
                    double bv = 0;
                    for (int64_t i = 0; i < E; ++i) {
                        bool taken = false;
                        for (int64_t q = 0; q < j; ++q) taken = taken || chosen[q] == i;
                        if (taken) continue;
                        double v = LoadD(row + i);
                        if (best < 0 || v > bv) {
                            best = i;
                            bv = v;
                        }
                    }
                    chosen[j] = best;
                }
                double m = LoadD(row + chosen[0]), denom = 0;
                if (normalize) {
                    for (int64_t j = 0; j < k; ++j) denom += std::exp(LoadD(row + chosen[j]) - m);
                } else {
                    for (int64_t i = 0; i < E; ++i) m = std::fmax(m, LoadD(row + i));
                    for (int64_t i = 0; i < E; ++i) denom += std::exp(LoadD(row + i) - m);
                }
                for (int64_t j = 0; j < k; ++j) {
                    wp[r * k + j] = static_cast<S>(std::exp(LoadD(row + chosen[j]) - m) / denom);
                }
            }
        });
    });
}

void MoeTopkBackwardKernel(KernelContext& ctx) {
    const Tensor &logits = ctx.in[0], &experts = ctx.in[1], &grad = ctx.in[2];
    const bool normalize = ctx.i(0) != 0;
    const int64_t n = logits.size(0), E = logits.size(1), k = experts.size(1);
    CheckExperts("moe_topk_backward", experts, E);
    const int64_t* ep = experts.data<int64_t>();
    // Per-thread rows: softmax probabilities (or the chosen weights) and the gradient being built.
    std::vector<double> scratch(static_cast<size_t>(omp_get_max_threads()) * 2 * (E + k));
    DispatchFloat(logits.dtype(), "moe_topk_backward", [&](auto tag) {
        using T = decltype(tag);
        using S = Acc<T>;
        const T* xp = logits.data<T>();
        const S* gp = grad.data<S>();
        T* dp = ctx.out[0].data<T>();
        ParallelFor(n, E * 4 + k * 4, [&](int64_t b, int64_t e) {
            double* p = scratch.data() + omp_get_thread_num() * 2 * (E + k);
            double* dl = p + E + k;
            for (int64_t r = b; r < e; ++r) {
                const T* row = xp + r * E;
                const int64_t* chosen = ep + r * k;
                const S* g = gp + r * k;
                std::fill(dl, dl + E, 0.0);
                if (normalize) {
                    double m = -INFINITY, denom = 0, dot = 0;
                    for (int64_t j = 0; j < k; ++j) m = std::fmax(m, LoadD(row + chosen[j]));
                    for (int64_t j = 0; j < k; ++j) denom += (p[j] = std::exp(LoadD(row + chosen[j]) - m));
                    for (int64_t j = 0; j < k; ++j) dot += static_cast<double>(g[j]) * (p[j] /= denom);
                    for (int64_t j = 0; j < k; ++j) dl[chosen[j]] += p[j] * (g[j] - dot);
                } else {
                    double m = -INFINITY, denom = 0, dot = 0;
                    for (int64_t i = 0; i < E; ++i) m = std::fmax(m, LoadD(row + i));
                    for (int64_t i = 0; i < E; ++i) denom += (p[i] = std::exp(LoadD(row + i) - m));
                    for (int64_t i = 0; i < E; ++i) p[i] /= denom;
                    for (int64_t j = 0; j < k; ++j) dot += static_cast<double>(g[j]) * p[chosen[j]];
                    for (int64_t i = 0; i < E; ++i) dl[i] = -p[i] * dot;
                    for (int64_t j = 0; j < k; ++j) dl[chosen[j]] += p[chosen[j]] * g[j];
                }
                for (int64_t i = 0; i < E; ++i) Store(dp + r * E + i, static_cast<Acc<T>>(dl[i]));
            }
        });
    });
}

void MoePermuteKernel(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &experts = ctx.in[1];
    const int64_t E = ctx.i(0), k = experts.size(1), slots = experts.numel();
    DispatchFloat(x.dtype(), "moe_permute", [](auto) {});
    CheckExperts("moe_permute", experts, E);
    const int64_t* ep = experts.data<int64_t>();
    int64_t* src = ctx.out[1].data<int64_t>();
    int64_t* counts = ctx.out[2].data<int64_t>();
    // Stable counting sort of the slots by expert: rows of one expert keep token order.
    std::fill(counts, counts + E, int64_t{0});
    for (int64_t s = 0; s < slots; ++s) ++counts[ep[s]];
    std::vector<int64_t> next(E, 0);
    for (int64_t e = 1; e < E; ++e) next[e] = next[e - 1] + counts[e - 1];
    for (int64_t s = 0; s < slots; ++s) src[next[ep[s]]++] = s;
    const size_t row = x.size(1) * DataTypeSize(x.dtype());
    if (row == 0) return;
    const char* xp = static_cast<const char*>(x.data());
    char* op = static_cast<char*>(ctx.out[0].data());
    ParallelFor(slots, x.size(1), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) std::memcpy(op + r * row, xp + (src[r] / k) * row, row);
    });
}

void MoeUnpermuteKernel(KernelContext& ctx) {
    const Tensor &y = ctx.in[0], &source = ctx.in[1], &w = ctx.in[2];
    const int64_t n = w.size(0), k = w.size(1), C = y.size(1);
    std::vector<int64_t> pos = InversePermutation("moe_unpermute", source);
    std::vector<double> scratch(static_cast<size_t>(omp_get_max_threads()) * C);
    DispatchFloat(y.dtype(), "moe_unpermute", [&](auto tag) {
        using T = decltype(tag);
        using S = Acc<T>;
        const T* yp = y.data<T>();
        const S* wp = w.data<S>();
        T* op = ctx.out[0].data<T>();
        ParallelFor(n, k * C, [&](int64_t b, int64_t e) {
            double* acc = scratch.data() + omp_get_thread_num() * C;
            for (int64_t t = b; t < e; ++t) {
                std::fill(acc, acc + C, 0.0);
                for (int64_t j = 0; j < k; ++j) {
                    const double wt = wp[t * k + j];
                    const T* yr = yp + pos[t * k + j] * C;
                    for (int64_t c = 0; c < C; ++c) acc[c] += wt * LoadD(yr + c);
                }
                for (int64_t c = 0; c < C; ++c) Store(op + t * C + c, static_cast<Acc<T>>(acc[c]));
            }
        });
    });
}

void MoeUnpermuteBackwardKernel(KernelContext& ctx) {
    const Tensor &grad = ctx.in[0], &y = ctx.in[1], &source = ctx.in[2], &w = ctx.in[3];
    const int64_t k = w.size(1), C = y.size(1), rows = y.size(0);
    InversePermutation("moe_unpermute_backward", source);  // validates
    const int64_t* src = source.data<int64_t>();
    DispatchFloat(y.dtype(), "moe_unpermute_backward", [&](auto tag) {
        using T = decltype(tag);
        using S = Acc<T>;
        const T *gp = grad.data<T>(), *yp = y.data<T>();
        const S* wp = w.data<S>();
        T* dyp = ctx.out[0].data<T>();
        S* dwp = ctx.out[1].data<S>();
        ParallelFor(rows, 2 * C, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
                const int64_t s = src[r];
                const T* g = gp + (s / k) * C;
                const T* yr = yp + r * C;
                const double wt = wp[s];
                double dot = 0;
                for (int64_t c = 0; c < C; ++c) {
                    const double gv = LoadD(g + c);
                    dot += gv * LoadD(yr + c);
                    Store(dyp + r * C + c, static_cast<Acc<T>>(wt * gv));
                }
                dwp[s] = static_cast<S>(dot);
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "moe_topk", MoeTopkKernel);
REGISTER_KERNEL(DeviceType::kCPU, "moe_topk_backward", MoeTopkBackwardKernel);
REGISTER_KERNEL(DeviceType::kCPU, "moe_permute", MoePermuteKernel);
REGISTER_KERNEL(DeviceType::kCPU, "moe_unpermute", MoeUnpermuteKernel);
REGISTER_KERNEL(DeviceType::kCPU, "moe_unpermute_backward", MoeUnpermuteBackwardKernel);

}  // namespace infinitrain::cpu
