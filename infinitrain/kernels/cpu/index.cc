// Indexing ops: embedding / embedding_backward and gather / scatter_add.
//
// embedding: weight [V, C], index int64 [...] (N entries) -> out [..., C] =
// rows of weight. embedding_backward: grad [..., C] -> dweight [V, C], each
// row the sum of the grad rows whose index names it. gather / scatter_add
// work along one dim: x is viewed as (outer, n, inner) and index / src as
// (outer, m, inner) (equal outside dim, which the meta checks).
//
// Index values are checked before anything is written, serially, so a bad
// one raises std::out_of_range instead of reading or writing out of bounds
// (and never throws inside an OpenMP region). Sums are accumulated in double
// in a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

inline double LoadD(const float* p) { return *p; }
inline double LoadD(const double* p) { return *p; }
inline double LoadD(const bf16* p) { return BF16ToFloat(p->bits); }
inline double LoadD(const f16* p) { return HalfToFloat(p->bits); }

void CheckIndices(const char* op, const int64_t* idx, int64_t n, int64_t limit, const std::string& what) {
    for (int64_t i = 0; i < n; ++i) {
        if (idx[i] < 0 || idx[i] >= limit) {
            throw std::out_of_range(std::string(op) + ": index " + std::to_string(idx[i]) + " out of range for " +
                                    what + " (expected 0 <= index < " + std::to_string(limit) + ")");
        }
    }
}

void Split3(const Shape& s, int64_t dim, int64_t* outer, int64_t* inner) {
    *outer = 1;
    *inner = 1;
    for (int64_t i = 0; i < dim; ++i) *outer *= s[i];
    for (size_t i = dim + 1; i < s.size(); ++i) *inner *= s[i];
}

// out[n, :] = weight[index[n], :], rows copied as bytes.
void EmbeddingKernel(KernelContext& c) {
    const Tensor& w = c.in[0];
    const Tensor& index = c.in[1];
    DispatchFloat(w.dtype(), "embedding", [](auto) {});
    const int64_t V = w.size(0), C = w.size(1), N = index.numel();
    const int64_t* idx = index.data<int64_t>();
    CheckIndices("embedding", idx, N, V, "a weight with " + std::to_string(V) + " rows");
    const size_t row = C * DataTypeSize(w.dtype());
    if (row == 0) return;
    const char* src = static_cast<const char*>(w.data());
    char* dst = static_cast<char*>(c.out[0].data());
    ParallelFor(N, C, [&](int64_t b, int64_t e) {
        for (int64_t n = b; n < e; ++n) std::memcpy(dst + n * row, src + idx[n] * row, row);
    });
}

// dweight[v, :] = sum of grad[n, :] over n with index[n] == v. The positions
// are bucketed by row (counting sort, stable), then each row is summed in
// double by one thread: no races, no V x C double buffer.
void EmbeddingBackwardKernel(KernelContext& c) {
    const Tensor& grad = c.in[0];
    const Tensor& index = c.in[1];
    Tensor& dw = c.out[0];
    const int64_t V = dw.size(0), C = dw.size(1), N = index.numel();
    const int64_t* idx = index.data<int64_t>();
    CheckIndices("embedding_backward", idx, N, V, "num_weights " + std::to_string(V));
    std::vector<int64_t> start(V + 1, 0), pos(N);
    for (int64_t n = 0; n < N; ++n) ++start[idx[n] + 1];
    for (int64_t v = 0; v < V; ++v) start[v + 1] += start[v];
    {
        std::vector<int64_t> fill(start.begin(), start.end() - 1);
        for (int64_t n = 0; n < N; ++n) pos[fill[idx[n]]++] = n;
    }
    DispatchFloat(grad.dtype(), "embedding_backward", [&](auto tag) {
        using T = decltype(tag);
        const T* g = grad.data<T>();
        T* d = dw.data<T>();
        if (dw.numel() == 0) return;
        ParallelFor(V, C * (1 + N / std::max<int64_t>(V, 1)), [&](int64_t b, int64_t e) {
            std::vector<double> acc(C);
            for (int64_t v = b; v < e; ++v) {
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int64_t p = start[v]; p < start[v + 1]; ++p) {
                    const T* gr = g + pos[p] * C;
                    for (int64_t j = 0; j < C; ++j) acc[j] += LoadD(gr + j);
                }
                for (int64_t j = 0; j < C; ++j) Store(d + v * C + j, static_cast<Acc<T>>(acc[j]));
            }
        });
    });
}

// out[o, j, i] = x[o, index[o, j, i], i].
void GatherKernel(KernelContext& c) {
    const Tensor& x = c.in[0];
    const Tensor& index = c.in[1];
    const int64_t d = NormalizeDim("gather", c.i(0), x.dim());
    int64_t outer, inner;
    Split3(x.shape(), d, &outer, &inner);
    const int64_t n = x.dim() ? x.shape()[d] : 1, m = index.dim() ? index.shape()[d] : 1;
    const int64_t* idx = index.data<int64_t>();
    CheckIndices("gather", idx, index.numel(), n, "dim " + std::to_string(d) + " of size " + std::to_string(n));
    DispatchFloat(x.dtype(), "gather", [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.data<T>();
        T* yp = c.out[0].data<T>();
        const int64_t total = index.numel();
        ParallelFor(total, 2, [&](int64_t b, int64_t e) {
            for (int64_t q = b; q < e; ++q) {
                int64_t o = q / (m * inner), i = q % inner;
                yp[q] = xp[(o * n + idx[q]) * inner + i];
            }
        });
    });
}

// out = x, then out[o, index[o, j, i], i] += src[o, j, i]. Tasks own whole
// columns (o, a chunk of i) and add into a double copy of their slab of x, so
// colliding indices never race and sums round once.
void ScatterAddKernel(KernelContext& c) {
    const Tensor& x = c.in[0];
    const Tensor& index = c.in[1];
    const Tensor& src = c.in[2];
    const int64_t d = NormalizeDim("scatter_add", c.i(0), x.dim());
    int64_t outer, inner;
    Split3(x.shape(), d, &outer, &inner);
    const int64_t n = x.dim() ? x.shape()[d] : 1, m = index.dim() ? index.shape()[d] : 1;
    const int64_t* idx = index.data<int64_t>();
    CheckIndices("scatter_add", idx, index.numel(), n, "dim " + std::to_string(d) + " of size " + std::to_string(n));
    DispatchFloat(x.dtype(), "scatter_add", [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.data<T>();
        const T* sp = src.data<T>();
        T* yp = c.out[0].data<T>();
        if (x.numel() == 0) return;
        // Column chunk: wide enough for contiguous access, small enough that n * K doubles stay modest.
        const int64_t K = std::max<int64_t>(1, std::min<int64_t>(inner, (1 << 16) / n));
        const int64_t nc = (inner + K - 1) / K;
        ParallelFor(outer * nc, (n + m) * K, [&](int64_t b, int64_t e) {
            std::vector<double> buf(n * K);
            for (int64_t t = b; t < e; ++t) {
                int64_t o = t / nc, c0 = (t % nc) * K, cw = std::min(K, inner - c0);
                for (int64_t r = 0; r < n; ++r) {
                    const T* row = xp + (o * n + r) * inner + c0;
                    for (int64_t j = 0; j < cw; ++j) buf[r * K + j] = LoadD(row + j);
                }
                for (int64_t r = 0; r < m; ++r) {
                    const int64_t base = (o * m + r) * inner + c0;
                    for (int64_t j = 0; j < cw; ++j) buf[idx[base + j] * K + j] += LoadD(sp + base + j);
                }
                for (int64_t r = 0; r < n; ++r) {
                    T* row = yp + (o * n + r) * inner + c0;
                    for (int64_t j = 0; j < cw; ++j) Store(row + j, static_cast<Acc<T>>(buf[r * K + j]));
                }
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "embedding", EmbeddingKernel);
REGISTER_KERNEL(DeviceType::kCPU, "embedding_backward", EmbeddingBackwardKernel);
REGISTER_KERNEL(DeviceType::kCPU, "gather", GatherKernel);
REGISTER_KERNEL(DeviceType::kCPU, "scatter_add", ScatterAddKernel);

}  // namespace infinitrain::cpu
