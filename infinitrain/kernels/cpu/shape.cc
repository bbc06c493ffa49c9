// Shape ops: permute, slice / slice_backward, concat, stack, split, tril / triu.
//
// Every tensor is contiguous row-major, so these ops are copies. All but
// tril/triu accept every dtype: they move elements as raw bytes of
// DataTypeSize(dtype). Each op views its tensors as (outer, n, inner) around
// the dim it works on, so a run of `inner` elements is one contiguous block.
#include <algorithm>
#include <cstring>
#include <vector>

#include "infinitrain/kernels/cpu/common.h"

namespace infinitrain::cpu {
namespace {

char* Bytes(const Tensor& t) { return static_cast<char*>(t.data()); }

void Split3(const Shape& s, int64_t dim, int64_t* outer, int64_t* inner) {
    *outer = 1;
    *inner = 1;
    for (int64_t i = 0; i < dim; ++i) *outer *= s[i];
    for (size_t i = dim + 1; i < s.size(); ++i) *inner *= s[i];
}

// Copies n elements of `esize` bytes with a source stride (in elements) into a contiguous destination.
template <typename U>
void StridedCopy(char* dst, const char* src, int64_t n, int64_t stride) {
    U* d = reinterpret_cast<U*>(dst);
    const U* s = reinterpret_cast<const U*>(src);
    for (int64_t i = 0; i < n; ++i) d[i] = s[i * stride];
}

void StridedCopyAny(char* dst, const char* src, int64_t n, int64_t stride, size_t esize) {
    switch (esize) {
        case 1:
            StridedCopy<uint8_t>(dst, src, n, stride);
            return;
        case 2:
            StridedCopy<uint16_t>(dst, src, n, stride);
            return;
        case 4:
            StridedCopy<uint32_t>(dst, src, n, stride);
            return;
        case 8:
            StridedCopy<uint64_t>(dst, src, n, stride);
            return;
        default:
            for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * esize, src + i * stride * esize, esize);
    }
}

// ---- permute ----
// out[i0, .., ik] = x[...] with out dim k taken from x dim dims[k]. Output dims
// are walked in order; each gets the input stride of its source dim. Size-1
// dims are dropped and output dims that are contiguous in the input are merged,
// so e.g. [B, T, H, D] -> [B, H, T, D] copies rows of D with memcpy.
void PermuteKernel(KernelContext& c) {
    const Tensor& x = c.in[0];
    Tensor& y = c.out[0];
    const size_t es = DataTypeSize(x.dtype());
    const int64_t nd = x.dim();
    if (y.numel() == 0) return;
    const auto& dims = c.ints(0);
    std::vector<int64_t> xstride(nd, 1);
    for (int64_t i = nd - 2; i >= 0; --i) xstride[i] = xstride[i + 1] * x.shape()[i + 1];
    std::vector<int64_t> size, stride;  // coalesced output dims and their input strides
    for (int64_t k = 0; k < nd; ++k) {
        int64_t d = NormalizeDim("permute", dims[k], nd);
        int64_t s = x.shape()[d], st = xstride[d];
        if (s == 1) continue;
        if (!size.empty() && stride.back() == st * s) {
            size.back() *= s;
            stride.back() = st;
        } else {
            size.push_back(s);
            stride.push_back(st);
        }
    }
    if (size.empty()) {  // a single element
        std::memcpy(Bytes(y), Bytes(x), es);
        return;
    }
    const int64_t m = static_cast<int64_t>(size.size());
    const int64_t row = size.back(), rstride = stride.back();
    const int64_t rows = y.numel() / row;
    const char* src = Bytes(x);
    char* dst = Bytes(y);
    ParallelFor(rows, row, [&](int64_t b, int64_t e) {
        // Multi-index of row b over the leading m-1 coalesced dims, then step it.
        std::vector<int64_t> idx(m, 0);
        int64_t r = b, off = 0;
        for (int64_t k = m - 2; k >= 0; --k) {
            idx[k] = r % size[k];
            r /= size[k];
            off += idx[k] * stride[k];
        }
        for (int64_t q = b; q < e; ++q) {
            char* d = dst + q * row * es;
            if (rstride == 1) {
                std::memcpy(d, src + off * es, row * es);
            } else {
                StridedCopyAny(d, src + off * es, row, rstride, es);
            }
            for (int64_t k = m - 2; k >= 0; --k) {
                off += stride[k];
                if (++idx[k] < size[k]) break;
                off -= idx[k] * stride[k];
                idx[k] = 0;
            }
        }
    });
}

// ---- slice / slice_backward ----
// The same normalisation as the meta's: negative start/end count from the end,
// both clamp to [0, n], end >= start; step > 0.
struct Slice {
    int64_t dim, start, step, len;
};

Slice NormalizeSlice(const char* op, const Shape& s, int64_t dim, int64_t start, int64_t end, int64_t step) {
    Slice r;
    r.dim = NormalizeDim(op, dim, static_cast<int64_t>(s.size()));
    const int64_t n = s[r.dim];
    if (step <= 0) OpError(op, "step must be positive, got " + std::to_string(step));
    auto clampi = [n](int64_t v) { return std::min(std::max(v < 0 ? v + n : v, int64_t{0}), n); };
    r.start = clampi(start);
    int64_t e = std::max(clampi(end), r.start);
    r.step = step;
    r.len = (e - r.start + step - 1) / step;
    return r;
}

// Copies between the full tensor `full` (outer, n, inner) and the sliced one
// `part` (outer, len, inner); to_part picks the direction.
void SliceCopy(const Tensor& full, const Tensor& part, const Slice& sp, bool to_part) {
    const size_t es = DataTypeSize(full.dtype());
    int64_t outer, inner;
    Split3(full.shape(), sp.dim, &outer, &inner);
    const int64_t n = full.shape()[sp.dim];
    const size_t block = inner * es;
    char* f = Bytes(full);
    char* p = Bytes(part);
    if (sp.len == 0 || inner == 0) return;
    if (sp.step == 1) {  // one contiguous block of len * inner per outer index
        const size_t run = sp.len * block;
        ParallelFor(outer, sp.len * inner, [&](int64_t b, int64_t e) {
            for (int64_t o = b; o < e; ++o) {
                char* fp = f + ((o * n + sp.start) * inner) * es;
                char* pp = p + o * run;
                if (to_part) {
                    std::memcpy(pp, fp, run);
                } else {
                    std::memcpy(fp, pp, run);
                }
            }
        });
        return;
    }
    ParallelFor(outer * sp.len, inner, [&](int64_t b, int64_t e) {
        for (int64_t q = b; q < e; ++q) {
            int64_t o = q / sp.len, j = q % sp.len;
            char* fp = f + ((o * n + sp.start + j * sp.step) * inner) * es;
            char* pp = p + q * block;
            if (to_part) {
                std::memcpy(pp, fp, block);
            } else {
                std::memcpy(fp, pp, block);
            }
        }
    });
}

void SliceKernel(KernelContext& c) {
    const Tensor& x = c.in[0];
    Slice sp = NormalizeSlice("slice", x.shape(), c.i(0), c.i(1), c.i(2), c.i(3));
    SliceCopy(x, c.out[0], sp, true);
}

void SliceBackwardKernel(KernelContext& c) {
    Tensor& dx = c.out[0];
    Slice sp = NormalizeSlice("slice_backward", dx.shape(), c.i(1), c.i(2), c.i(3), c.i(4));
    // All-zero bytes are zero in every dtype.
    char* p = Bytes(dx);
    const int64_t nb = static_cast<int64_t>(dx.nbytes());
    ParallelFor(nb, 1, [&](int64_t b, int64_t e) { std::memset(p + b, 0, e - b); });
    SliceCopy(dx, c.in[0], sp, false);
}

// ---- concat / stack / split ----
// The joined tensor is (outer, total, inner) and piece k is (outer, n_k, inner)
// at offset off_k along the middle dim; stack is concat with n_k = 1.
void JoinOrSplit(const std::vector<Tensor>& pieces, const std::vector<int64_t>& n, const Tensor& whole, int64_t outer,
                 int64_t inner, bool join) {
    const size_t es = DataTypeSize(whole.dtype());
    const int64_t np = static_cast<int64_t>(pieces.size());
    std::vector<int64_t> off(np + 1, 0);
    for (int64_t k = 0; k < np; ++k) off[k + 1] = off[k] + n[k];
    const int64_t total = off[np];
    char* w = Bytes(whole);
    if (whole.numel() == 0) return;
    ParallelFor(outer * np, total * inner / std::max<int64_t>(np, 1), [&](int64_t b, int64_t e) {
        for (int64_t q = b; q < e; ++q) {
            int64_t o = q / np, k = q % np;
            size_t block = n[k] * inner * es;
            if (block == 0) continue;
            char* wp = w + (o * total + off[k]) * inner * es;
            char* pp = Bytes(pieces[k]) + o * block;
            if (join) {
                std::memcpy(wp, pp, block);
            } else {
                std::memcpy(pp, wp, block);
            }
        }
    });
}

void ConcatKernel(KernelContext& c) {
    const Tensor& y = c.out[0];
    const int64_t d = NormalizeDim("concat", c.i(0), y.dim());
    int64_t outer, inner;
    Split3(y.shape(), d, &outer, &inner);
    std::vector<int64_t> n;
    for (const Tensor& t : c.in) n.push_back(t.shape()[d]);
    JoinOrSplit(c.in, n, y, outer, inner, true);
}

void StackKernel(KernelContext& c) {
    const Tensor& y = c.out[0];
    const int64_t d = NormalizeDim("stack", c.i(0), y.dim());
    int64_t outer, inner;
    Split3(y.shape(), d, &outer, &inner);
    std::vector<int64_t> n(c.in.size(), 1);
    JoinOrSplit(c.in, n, y, outer, inner, true);
}

void SplitKernel(KernelContext& c) {
    const Tensor& x = c.in[0];
    const int64_t d = NormalizeDim("split", c.i(0), x.dim());
    int64_t outer, inner;
    Split3(x.shape(), d, &outer, &inner);
    JoinOrSplit(c.out, c.ints(1), x, outer, inner, false);
}

// ---- tril / triu ----
// Over the last two dims [M, N], batched over the rest: tril keeps j <= i + k,
// triu keeps j >= i + k; the other elements become zero.
template <bool kLower>
void TriKernel(KernelContext& c) {
    const Tensor& x = c.in[0];
    const int64_t k = c.i(0);
    const int64_t M = x.size(-2), N = x.size(-1);
    if (x.numel() == 0) return;
    const int64_t rows = x.numel() / N;
    DispatchFloat(x.dtype(), kLower ? "tril" : "triu", [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.data<T>();
        T* yp = c.out[0].data<T>();
        ParallelFor(rows, N, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
                const int64_t i = r % M;
                // Columns [0, lo) and [hi, N) are zero; [lo, hi) copied.
                int64_t lo = kLower ? 0 : std::clamp(i + k, int64_t{0}, N);
                int64_t hi = kLower ? std::clamp(i + k + 1, int64_t{0}, N) : N;
                const T* s = xp + r * N;
                T* d = yp + r * N;
                for (int64_t j = 0; j < lo; ++j) d[j] = T{};
                for (int64_t j = lo; j < hi; ++j) d[j] = s[j];
                for (int64_t j = std::max(hi, lo); j < N; ++j) d[j] = T{};
            }
        });
    });
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "permute", PermuteKernel);
REGISTER_KERNEL(DeviceType::kCPU, "slice", SliceKernel);
REGISTER_KERNEL(DeviceType::kCPU, "slice_backward", SliceBackwardKernel);
REGISTER_KERNEL(DeviceType::kCPU, "concat", ConcatKernel);
REGISTER_KERNEL(DeviceType::kCPU, "stack", StackKernel);
REGISTER_KERNEL(DeviceType::kCPU, "split", SplitKernel);
REGISTER_KERNEL(DeviceType::kCPU, "tril", TriKernel<true>);
REGISTER_KERNEL(DeviceType::kCPU, "triu", TriKernel<false>);

}  // namespace infinitrain::cpu
