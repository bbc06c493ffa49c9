// Op adapters for permute, slice, slice_backward, concat, stack, split, tril and triu (kernels in shape.cuh).
#include <algorithm>
#include <vector>

#include "backends/gpu/context.h"
#include "backends/gpu/map.cuh"
#include "backends/gpu/shape.cuh"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void Split3(const Shape& s, int64_t dim, int64_t* outer, int64_t* inner) {
    *outer = 1;
    *inner = 1;
    for (int64_t i = 0; i < dim; ++i) *outer *= s[i];
    for (size_t i = dim + 1; i < s.size(); ++i) *inner *= s[i];
}

void Permute(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &y = ctx.out[0];
    const int64_t nd = x.dim(), n = y.numel();
    if (n == 0) return;
    const auto& dims = ctx.ints(0);
    std::vector<int64_t> xstride(nd, 1);
    for (int64_t i = nd - 2; i >= 0; --i) xstride[i] = xstride[i + 1] * x.shape()[i + 1];
    std::vector<int64_t> size, stride;  // coalesced output dims and their input strides
    for (int64_t k = 0; k < nd; ++k) {
        const int64_t d = NormalizeDim("permute", dims[k], nd);
        const int64_t sz = x.shape()[d], st = xstride[d];
        if (sz == 1) continue;
        if (!size.empty() && stride.back() == st * sz) {
            size.back() *= sz;
            stride.back() = st;
        } else {
            size.push_back(sz);
            stride.push_back(st);
        }
    }
    NativeStream_t s = NativeStream(ctx);
    if (size.size() <= 1) {  // the identity order: a copy
        MemcpyDeviceAsync(y.data(), x.data(), x.nbytes(), s);
        return;
    }
    if (static_cast<int>(size.size()) > kMaxDims) {
        OpError("permute", "more than " + std::to_string(kMaxDims) + " non-mergeable dims are not supported");
    }
    // A contiguous innermost dim moves in wider units: every stride and the innermost size must divide evenly.
    const int64_t es = static_cast<int64_t>(DataTypeSize(x.dtype()));
    int64_t unit = 1;  // elements per unit
    if (stride.back() == 1) {
        for (int64_t bytes : {16, 8, 4, 2}) {
            const int64_t k = bytes / es;
            if (k < 2 || bytes % es) continue;
            bool ok = size.back() % k == 0 && Aligned(x.data(), bytes) && Aligned(y.data(), bytes);
            for (size_t d = 0; d + 1 < stride.size(); ++d) ok = ok && stride[d] % k == 0;
            if (ok) {
                unit = k;
                break;
            }
        }
    }
    size.back() /= unit;
    for (size_t d = 0; d + 1 < stride.size(); ++d) stride[d] /= unit;
    const int64_t units = n / unit;
    auto launch = [&](auto utag, auto itag) {
        using U = typename decltype(utag)::type;
        using I = typename decltype(itag)::type;
        PermutePlan<I> p{};
        p.nd = static_cast<int>(size.size());
        for (int d = 0; d < p.nd; ++d) {
            p.size[d] = static_cast<I>(size[d]);
            p.stride[d] = static_cast<I>(stride[d]);
        }
        PermuteKernel<U, I><<<Blocks((units + kPermuteUnroll - 1) / kPermuteUnroll), kThreads, 0, s>>>(
            p, static_cast<const U*>(x.data()), static_cast<U*>(y.data()), static_cast<I>(units));
    };
    auto with_index = [&](auto utag) {
        if (units < (int64_t{1} << 31) - (int64_t{1} << 27)) {  // headroom for the last grid stride
            launch(utag, Tag<int32_t>{});
        } else {
            launch(utag, Tag<int64_t>{});
        }
    };
    switch (unit * es) {
        case 16:
            with_index(Tag<uint4>{});
            break;
        case 8:
            with_index(Tag<uint64_t>{});
            break;
        case 4:
            with_index(Tag<uint32_t>{});
            break;
        case 2:
            with_index(Tag<uint16_t>{});
            break;
        default:
            with_index(Tag<uint8_t>{});
    }
    GPU_CHECK_LAUNCH("permute");
}

// Copies `rows` rows of `row_bytes` from src (row stride src_stride bytes) to dst (dst_stride), in the widest
// unit that divides every length, stride and pointer.
void RowCopy(const void* src, void* dst, int64_t rows, int64_t row_bytes, int64_t src_stride, int64_t dst_stride,
             NativeStream_t s) {
    if (rows == 0 || row_bytes == 0) return;
    for (int64_t u : {16, 8, 4, 2, 1}) {
        if (row_bytes % u || src_stride % u || dst_stride % u || !Aligned(src, u) || !Aligned(dst, u)) continue;
        auto launch = [&](auto utag, auto itag) {
            using U = typename decltype(utag)::type;
            using I = typename decltype(itag)::type;
            RowCopyKernel<U, I><<<Blocks(rows * (row_bytes / u)), kThreads, 0, s>>>(
                static_cast<const U*>(src), static_cast<U*>(dst), static_cast<I>(rows), static_cast<I>(row_bytes / u),
                static_cast<I>(src_stride / u), static_cast<I>(dst_stride / u));
        };
        const bool small = rows * (src_stride > dst_stride ? src_stride : dst_stride) / u < (int64_t{1} << 31);
        auto with_index = [&](auto utag) {
            if (small) {
                launch(utag, Tag<int32_t>{});
            } else {
                launch(utag, Tag<int64_t>{});
            }
        };
        switch (u) {
            case 16:
                with_index(Tag<uint4>{});
                break;
            case 8:
                with_index(Tag<uint64_t>{});
                break;
            case 4:
                with_index(Tag<uint32_t>{});
                break;
            case 2:
                with_index(Tag<uint16_t>{});
                break;
            default:
                with_index(Tag<uint8_t>{});
        }
        return;
    }
}

template <typename U>
void LaunchSliceCopy(void* full, void* part, int64_t outer, int64_t n, int64_t len, int64_t inner, int64_t start,
                     int64_t step, bool to_part, NativeStream_t s) {
    SliceCopyKernel<U><<<Blocks(outer * len * inner), kThreads, 0, s>>>(static_cast<U*>(full), static_cast<U*>(part),
                                                                        outer, n, len, inner, start, step, to_part);
}

// Copies between full (outer, n, inner) and part (outer, len, inner) at [start : : step] of the middle dim, in
// the widest unit that divides an inner block and aligns both pointers.
void SliceCopy(const Tensor& full, const Tensor& part, int64_t outer, int64_t n, int64_t len, int64_t inner,
               int64_t start, int64_t step, bool to_part, NativeStream_t s, const char* op) {
    if (outer * len * inner == 0) return;
    const int64_t es = static_cast<int64_t>(DataTypeSize(full.dtype()));
    if (step == 1) {  // one contiguous run of len * inner per outer index
        char* f = static_cast<char*>(full.data()) + start * inner * es;
        char* p = static_cast<char*>(part.data());
        if (to_part) {
            RowCopy(f, p, outer, len * inner * es, n * inner * es, len * inner * es, s);
        } else {
            RowCopy(p, f, outer, len * inner * es, len * inner * es, n * inner * es, s);
        }
        GPU_CHECK_LAUNCH(op);
        return;
    }
    const int64_t block = inner * es;
    for (int64_t u : {16, 8, 4, 2, 1}) {
        if (block % u == 0 && Aligned(full.data(), u) && Aligned(part.data(), u)) {
            const int64_t in_u = block / u;
            switch (u) {
                case 16:
                    LaunchSliceCopy<uint4>(full.data(), part.data(), outer, n, len, in_u, start, step, to_part, s);
                    break;
                case 8:
                    LaunchSliceCopy<uint64_t>(full.data(), part.data(), outer, n, len, in_u, start, step, to_part, s);
                    break;
                case 4:
                    LaunchSliceCopy<uint32_t>(full.data(), part.data(), outer, n, len, in_u, start, step, to_part, s);
                    break;
                case 2:
                    LaunchSliceCopy<uint16_t>(full.data(), part.data(), outer, n, len, in_u, start, step, to_part, s);
                    break;
                default:
                    LaunchSliceCopy<uint8_t>(full.data(), part.data(), outer, n, len, in_u, start, step, to_part, s);
            }
            GPU_CHECK_LAUNCH(op);
            return;
        }
    }
}

struct SliceSpec {
    int64_t dim, start, step, len;
};

// The meta's normalisation: negative start/end count from the end, both clamp to [0, n], end >= start; step > 0.
SliceSpec NormalizeSlice(const char* op, const Shape& s, int64_t dim, int64_t start, int64_t end, int64_t step) {
    SliceSpec r;
    r.dim = NormalizeDim(op, dim, static_cast<int64_t>(s.size()));
    const int64_t n = s[r.dim];
    if (step <= 0) OpError(op, "step must be positive, got " + std::to_string(step));
    auto clampi = [n](int64_t v) { return std::min(std::max(v < 0 ? v + n : v, int64_t{0}), n); };
    r.start = clampi(start);
    const int64_t e = std::max(clampi(end), r.start);
    r.step = step;
    r.len = (e - r.start + step - 1) / step;
    return r;
}

void Slice(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &y = ctx.out[0];
    const SliceSpec sp = NormalizeSlice("slice", x.shape(), ctx.i(0), ctx.i(1), ctx.i(2), ctx.i(3));
    int64_t outer, inner;
    Split3(x.shape(), sp.dim, &outer, &inner);
    SliceCopy(x, y, outer, x.shape()[sp.dim], sp.len, inner, sp.start, sp.step, true, NativeStream(ctx), "slice");
}

void SliceBackward(KernelContext& ctx) {
    const Tensor &g = ctx.in[0], &dx = ctx.out[0];
    const SliceSpec sp = NormalizeSlice("slice_backward", dx.shape(), ctx.i(1), ctx.i(2), ctx.i(3), ctx.i(4));
    int64_t outer, inner;
    Split3(dx.shape(), sp.dim, &outer, &inner);
    NativeStream_t s = NativeStream(ctx);
    MemsetAsync(dx.data(), 0, dx.nbytes(), s);  // zero bits are zero in every dtype
    SliceCopy(dx, g, outer, dx.shape()[sp.dim], sp.len, inner, sp.start, sp.step, false, s, "slice_backward");
}

// Piece k is (outer, n[k], inner) at offset sum(n[:k]) of the whole's (outer, total, inner).
void JoinOrSplit(const std::vector<Tensor>& pieces, const std::vector<int64_t>& n, const Tensor& whole, int64_t outer,
                 int64_t inner, bool join, NativeStream_t s, const char* op) {
    int64_t total = 0;
    for (int64_t v : n) total += v;
    if (whole.numel() == 0) return;
    int64_t off = 0;
    for (size_t k = 0; k < pieces.size(); ++k) {
        SliceCopy(whole, pieces[k], outer, total, n[k], inner, off, 1, !join, s, op);
        off += n[k];
    }
}

void Concat(KernelContext& ctx) {
    const Tensor& y = ctx.out[0];
    const int64_t d = NormalizeDim("concat", ctx.i(0), y.dim());
    int64_t outer, inner;
    Split3(y.shape(), d, &outer, &inner);
    std::vector<int64_t> n;
    for (const Tensor& t : ctx.in) n.push_back(t.shape()[d]);
    JoinOrSplit(ctx.in, n, y, outer, inner, true, NativeStream(ctx), "concat");
}

void Stack(KernelContext& ctx) {
    const Tensor& y = ctx.out[0];
    const int64_t d = NormalizeDim("stack", ctx.i(0), y.dim());
    int64_t outer, inner;
    Split3(y.shape(), d, &outer, &inner);
    JoinOrSplit(ctx.in, std::vector<int64_t>(ctx.in.size(), 1), y, outer, inner, true, NativeStream(ctx), "stack");
}

void SplitOp(KernelContext& ctx) {
    const Tensor& x = ctx.in[0];
    const int64_t d = NormalizeDim("split", ctx.i(0), x.dim());
    int64_t outer, inner;
    Split3(x.shape(), d, &outer, &inner);
    JoinOrSplit(ctx.out, ctx.ints(1), x, outer, inner, false, NativeStream(ctx), "split");
}

template <bool kLower>
void Tri(KernelContext& ctx) {
    const char* op = kLower ? "tril" : "triu";
    const Tensor &x = ctx.in[0], &y = ctx.out[0];
    const int64_t M = x.size(-2), N = x.size(-1), total = x.numel();
    if (total == 0) return;
    DispatchFloat(x.dtype(), op, [](auto) {});
    DispatchBytes(x.dtype(), [&](auto tag) {
        using U = typename decltype(tag)::type;
        TriKernel<U, kLower>
            <<<Blocks(total), kThreads, 0, NativeStream(ctx)>>>(x.data<U>(), y.data<U>(), total, M, N, ctx.i(0));
    });
    GPU_CHECK_LAUNCH(op);
}

}  // namespace

REGISTER_PROVIDER_KERNEL(kProviderName, "permute", Permute);
REGISTER_PROVIDER_KERNEL(kProviderName, "slice", Slice);
REGISTER_PROVIDER_KERNEL(kProviderName, "slice_backward", SliceBackward);
REGISTER_PROVIDER_KERNEL(kProviderName, "concat", Concat);
REGISTER_PROVIDER_KERNEL(kProviderName, "stack", Stack);
REGISTER_PROVIDER_KERNEL(kProviderName, "split", SplitOp);
REGISTER_PROVIDER_KERNEL(kProviderName, "tril", Tri<true>);
REGISTER_PROVIDER_KERNEL(kProviderName, "triu", Tri<false>);

}  // namespace infinitrain::gpu
