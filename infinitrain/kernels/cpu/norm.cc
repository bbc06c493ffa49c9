// Softmax and normalisation layers.
//   softmax / log_softmax(x, dim) and their backwards view x as [outer, n, inner] with n = x.shape[dim]: each of the
//   outer * inner columns (stride inner) is normalised independently.
//     softmax_backward(out, grad):     dx = out * (grad - sum(grad * out))
//     log_softmax_backward(out, grad): dx = grad - exp(out) * sum(grad)
//   layernorm(x [R, C], weight [C], bias [C]): mean, rstd = 1 / sqrt(var + eps) per row (biased variance);
//     out = (x - mean) * rstd * weight + bias. R = the product of x's leading dims.
//     layernorm_backward: xhat = (x - mean) * rstd, dxhat = grad * weight,
//     dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dweight = sum_rows grad * xhat,
//     dbias = sum_rows grad.
//   rmsnorm(x [R, C], weight [C]): rstd = 1 / sqrt(mean(x^2) + eps); out = x * rstd * weight.
//     rmsnorm_backward: dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), dweight = sum_rows grad * xhat.
//   add_layernorm / add_rmsnorm(x, y, ...): sum = x + y rounded to x's dtype, then the norm of sum, out in its own
//     dtype (16-bit for float32 x under autocast); their backwards read a 16-bit grad for float32 x and add the
//     residual gradient to dx: for float32 after dx's rounding (the bits of the norm's backward and an add apart),
//     for 16-bit x before its one rounding.
// Row statistics (mean, rstd) are float32, or float64 for float64 inputs; every reduction accumulates in double.
// dweight / dbias sum over rows: each thread sums its rows into its own double buffer, the buffers are added at
// the end, so the result has no races.
#include <cmath>
#include <type_traits>
#include <vector>

#include "infinitrain/kernels/cpu/common.h"
#include "infinitrain/kernels/cpu/fastmath.h"

namespace infinitrain::cpu {
namespace {

struct Layout {
    int64_t outer, n, inner;
};

Layout SoftmaxLayout(const char* op, const Tensor& x, int64_t dim) {
    int64_t d = NormalizeDim(op, dim, x.dim());
    Layout l{1, x.shape()[d], 1};
    for (int64_t i = 0; i < d; ++i) l.outer *= x.shape()[i];
    for (int64_t i = d + 1; i < x.dim(); ++i) l.inner *= x.shape()[i];
    return l;
}

template <bool kLog>
void SoftmaxForward(KernelContext& ctx, const char* op) {
    const Tensor& x = ctx.in[0];
    const Tensor& out = ctx.out[0];
    Layout l = SoftmaxLayout(op, x, ctx.i(0));
    if (x.numel() == 0) return;
    DispatchFloat(x.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.data<T>();
        T* op_ = out.data<T>();
        ParallelFor(l.outer * l.inner, l.n * 8, [&](int64_t b, int64_t e) {
            for (int64_t col = b; col < e; ++col) {
                int64_t base = (col / l.inner) * l.n * l.inner + col % l.inner, st = l.inner;
                double mx = -INFINITY;
                for (int64_t j = 0; j < l.n; ++j) mx = std::fmax(mx, static_cast<double>(Load(xp + base + j * st)));
                double sum = 0;
                for (int64_t j = 0; j < l.n; ++j) sum += std::exp(Load(xp + base + j * st) - mx);
                if constexpr (kLog) {
                    double shift = mx + std::log(sum);
                    for (int64_t j = 0; j < l.n; ++j) Store(op_ + base + j * st, Load(xp + base + j * st) - shift);
                } else {
                    double inv = 1.0 / sum;
                    for (int64_t j = 0; j < l.n; ++j) {
                        Store(op_ + base + j * st, std::exp(Load(xp + base + j * st) - mx) * inv);
                    }
                }
            }
        });
    });
}

template <bool kLog>
void SoftmaxBackward(KernelContext& ctx, const char* op) {
    const Tensor &y = ctx.in[0], &g = ctx.in[1];
    const Tensor& dx = ctx.out[0];
    Layout l = SoftmaxLayout(op, y, ctx.i(0));
    if (y.numel() == 0) return;
    DispatchFloat(y.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        const T *yp = y.data<T>(), *gp = g.data<T>();
        T* dp = dx.data<T>();
        ParallelFor(l.outer * l.inner, l.n * 4, [&](int64_t b, int64_t e) {
            for (int64_t col = b; col < e; ++col) {
                int64_t base = (col / l.inner) * l.n * l.inner + col % l.inner, st = l.inner;
                double s = 0;
                for (int64_t j = 0; j < l.n; ++j) {
                    int64_t k = base + j * st;
                    s += kLog ? static_cast<double>(Load(gp + k)) : static_cast<double>(Load(gp + k)) * Load(yp + k);
                }
                for (int64_t j = 0; j < l.n; ++j) {
                    int64_t k = base + j * st;
                    double yv = Load(yp + k), gv = Load(gp + k);
                    Store(dp + k, kLog ? gv - std::exp(yv) * s : yv * (gv - s));
                }
            }
        });
    });
}

void SoftmaxKernel(KernelContext& ctx) { SoftmaxForward<false>(ctx, "softmax"); }
void LogSoftmaxKernel(KernelContext& ctx) { SoftmaxForward<true>(ctx, "log_softmax"); }
void SoftmaxBackwardKernel(KernelContext& ctx) { SoftmaxBackward<false>(ctx, "softmax_backward"); }
void LogSoftmaxBackwardKernel(KernelContext& ctx) { SoftmaxBackward<true>(ctx, "log_softmax_backward"); }

// ---- layernorm / rmsnorm --------------------------------------------------

DataType StatDtype(DataType t) { return t == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32; }

// The backward metas only check grad against x; the kernels check the rest before touching memory.
void CheckParam(const char* op, const Tensor& x, const Tensor& p, const char* what) {
    Shape c{x.dim() ? x.size(-1) : 0};
    if (x.dim() < 1) OpError(op, "x must be at least 1-d");
    if (p.dtype() != x.dtype() || p.shape() != c) {
        OpError(op, std::string(what) + " must be " + DataTypeName(x.dtype()) + " with shape " + ShapeToString(c) +
                        ", got " + DataTypeName(p.dtype()) + ShapeToString(p.shape()));
    }
}

void CheckStat(const char* op, const Tensor& x, const Tensor& s, const char* what) {
    Shape rows(x.shape().begin(), x.shape().end() - 1);
    DataType st = StatDtype(x.dtype());
    if (s.dtype() != st || s.shape() != rows) {
        OpError(op, std::string(what) + " must be " + DataTypeName(st) + " with shape " + ShapeToString(rows) +
                        ", got " + DataTypeName(s.dtype()) + ShapeToString(s.shape()));
    }
}

// Per-thread double buffers of `width` row sums; Sum(k) adds column k of the threads' buffers in thread order.
class RowSums {
public:
    explicit RowSums(int64_t width) : width_(width), buf_(static_cast<size_t>(omp_get_max_threads() * width), 0.0) {}
    double* Mine() { return buf_.data() + omp_get_thread_num() * width_; }
    double Sum(int64_t k) const {
        double s = 0;
        for (int64_t t = 0; t < omp_get_max_threads(); ++t) s += buf_[t * width_ + k];
        return s;
    }

private:
    int64_t width_;
    std::vector<double> buf_;
};

// Rows [b, e) of the forward. Built in vector-width clones (the double math runs 8 or 4 wide where the CPU has
// it); products are not contracted into FMAs, so the elementwise roundings are the same in every clone. With y
// (add_layernorm / add_rmsnorm), each row's x + y is first rounded to T into sp and normalised from there.
template <bool kRms, typename T, typename S, typename Y, typename O>
INFINITRAIN_SIMD_CLONES __attribute__((optimize("fp-contract=off"))) void NormForwardRows(const T* xp, const Y* yp,
                                                                                          T* sp, const T* wp,
                                                                                          const T* bp, O* outp, S* mp,
                                                                                          S* rp, int64_t c, double eps,
                                                                                          int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
        const T* xr = xp + r * c;
        O* yr = outp + r * c;
        if (yp) {
            const Y* ar = yp + r * c;
            T* sr = sp + r * c;
#pragma omp simd
            for (int64_t j = 0; j < c; ++j) Store(sr + j, static_cast<double>(Load(xr + j)) + Load(ar + j));
            xr = sr;
        }
        double mean = 0, var = 0;
        // omp simd: the double sums vectorise in several partial sums (reassociated, still in double).
        if (!kRms) {
#pragma omp simd reduction(+ : mean)
            for (int64_t j = 0; j < c; ++j) mean += Load(xr + j);
            mean = c ? mean / c : 0.0;
        }
#pragma omp simd reduction(+ : var)
        for (int64_t j = 0; j < c; ++j) {
            double d = Load(xr + j) - mean;
            var += d * d;
        }
        var = c ? var / c : 0.0;
        double rstd = 1.0 / std::sqrt(var + eps);
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) {
            double v = (Load(xr + j) - mean) * rstd * Load(wp + j);
            if (!kRms) v += Load(bp + j);
            // A 16-bit out of float32 x rounds through float32, as the norm and a cast apart do.
            if constexpr (!std::is_same_v<O, T>) v = static_cast<float>(v);
            Store(yr + j, v);
        }
        if (!kRms) mp[r] = static_cast<S>(mean);
        rp[r] = static_cast<S>(rstd);
    }
}

// Rows [b, e) of the backward: dx (plus the residual gradient rsp when given), and the rows' dweight and dbias
// added into dws and dbs (this thread's sums). grad is T, or 16-bit with float32 T.
template <bool kRms, typename T, typename S, typename G>
INFINITRAIN_SIMD_CLONES __attribute__((optimize("fp-contract=off"))) void NormBackwardRows(
    const G* gp, const T* xp, const T* wp, const S* mp, const S* rp, const T* rsp, T* dxp, double* dws, double* dbs,
    int64_t c, int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
        const G* gr = gp + r * c;
        const T* xr = xp + r * c;
        double mean = mp ? static_cast<double>(mp[r]) : 0.0, rstd = rp[r];
        double sum_d = 0, sum_dx = 0;  // sums of dxhat and dxhat * xhat
#pragma omp simd reduction(+ : sum_d, sum_dx)
        for (int64_t j = 0; j < c; ++j) {
            double gv = Load(gr + j), xh = (Load(xr + j) - mean) * rstd, d = gv * Load(wp + j);
            sum_d += d;
            sum_dx += d * xh;
            dws[j] += gv * xh;
            dbs[j] += gv;
        }
        double mean_d = kRms ? 0.0 : sum_d / c, mean_dx = sum_dx / c;
        if (rsp) {
            const T* rr = rsp + r * c;
#pragma omp simd
            for (int64_t j = 0; j < c; ++j) {
                double xh = (Load(xr + j) - mean) * rstd, d = static_cast<double>(Load(gr + j)) * Load(wp + j);
                double v = rstd * (d - mean_d - xh * mean_dx);
                // float32 rounds dx before the add, as the norm's backward and an add apart do (activation
                // recompute runs blocks unfused and must match bit for bit); 16-bit dtypes round once.
                if constexpr (std::is_same_v<T, float>) v = static_cast<float>(v);
                Store(dxp + r * c + j, v + Load(rr + j));
            }
        } else {
#pragma omp simd
            for (int64_t j = 0; j < c; ++j) {
                double xh = (Load(xr + j) - mean) * rstd, d = static_cast<double>(Load(gr + j)) * Load(wp + j);
                Store(dxp + r * c + j, rstd * (d - mean_d - xh * mean_dx));
            }
        }
    }
}

// Calls f(T{}, Y{}, O{}) with a norm's x dtype T, y's Y and out's O: both T, or for float32 x out 16-bit and y
// either (the shape rules admit nothing else).
template <typename F>
void DispatchNormTypes(const char* op, DataType t, DataType y, DataType o, F&& f) {
    DispatchFloat(t, op, [&](auto tt) {
        using T = decltype(tt);
        if constexpr (std::is_same_v<T, float>) {
            DispatchFloat(o, op, [&](auto ot) {
                using O = decltype(ot);
                if (y == t) {
                    f(T{}, T{}, O{});
                } else {
                    f(T{}, O{}, O{});
                }
            });
        } else {
            f(T{}, T{}, T{});
        }
    });
}

// layernorm in: x, weight, [bias]; out: y, [mean,] rstd. With kAdd (add_layernorm, add_rmsnorm) in: x, y,
// weight, [bias]; out: sum, y, [mean,] rstd.
template <bool kRms, bool kAdd>
void NormForward(KernelContext& ctx, const char* op) {
    const int k0 = kAdd ? 1 : 0;
    const Tensor &x = ctx.in[0], &w = ctx.in[1 + k0];
    const Tensor* add = kAdd ? &ctx.in[1] : nullptr;
    const Tensor* bias = kRms ? nullptr : &ctx.in[2 + k0];
    double eps = ctx.f(0);
    const Tensor& out = ctx.out[k0];
    const Tensor& rstd_t = ctx.out[(kRms ? 1 : 2) + k0];
    const Tensor* mean_t = kRms ? nullptr : &ctx.out[1 + k0];
    int64_t c = x.size(-1), rows = rstd_t.numel();
    if (rows == 0) return;
    DispatchNormTypes(op, x.dtype(), add ? add->dtype() : x.dtype(), out.dtype(), [&](auto tt, auto yt, auto ot) {
        using T = decltype(tt);
        using Y = decltype(yt);
        using O = decltype(ot);
        using S = Acc<T>;
        const T *xp = x.data<T>(), *wp = w.data<T>(), *bp = bias ? bias->data<T>() : nullptr;
        const Y* yp = add ? add->data<Y>() : nullptr;
        T* sp = add ? ctx.out[0].data<T>() : nullptr;
        O* outp = out.data<O>();
        S* mp = mean_t ? mean_t->data<S>() : nullptr;
        S* rp = rstd_t.data<S>();
        ParallelFor(rows, c * 8, [&](int64_t b, int64_t e) {
            NormForwardRows<kRms, T, S, Y, O>(xp, yp, sp, wp, bp, outp, mp, rp, c, eps, b, e);
        });
    });
}

// in: grad, x, weight, [mean,] rstd, [residual (kAdd, optional)]. out: dx, dweight, [dbias].
template <bool kRms, bool kAdd>
void NormBackward(KernelContext& ctx, const char* op) {
    const Tensor &g = ctx.in[0], &x = ctx.in[1], &w = ctx.in[2];
    const Tensor* mean_t = kRms ? nullptr : &ctx.in[3];
    const size_t nstat = kRms ? 1 : 2;
    const Tensor& rstd_t = ctx.in[2 + nstat];
    const Tensor* res = kAdd && ctx.in.size() > 3 + nstat ? &ctx.in[3 + nstat] : nullptr;
    CheckParam(op, x, w, "weight");
    if (mean_t) CheckStat(op, x, *mean_t, "mean");
    CheckStat(op, x, rstd_t, "rstd");
    const Tensor &dx = ctx.out[0], &dw = ctx.out[1];
    const Tensor* db = kRms ? nullptr : &ctx.out[2];
    int64_t c = x.size(-1), rows = rstd_t.numel();
    DispatchNormTypes(op, x.dtype(), g.dtype(), g.dtype(), [&](auto tt, auto gt, auto) {
        using T = decltype(tt);
        using G = decltype(gt);
        using S = Acc<T>;
        const G* gp = g.data<G>();
        const T *xp = x.data<T>(), *wp = w.data<T>(), *rsp = res ? res->data<T>() : nullptr;
        const S* mp = mean_t ? mean_t->data<S>() : nullptr;
        const S* rp = rstd_t.data<S>();
        T* dxp = dx.data<T>();
        RowSums sums(2 * c);  // [dweight | dbias] per thread
        ParallelFor(rows, c * 12, [&](int64_t b, int64_t e) {
            double* dws = sums.Mine();
            NormBackwardRows<kRms, T, S, G>(gp, xp, wp, mp, rp, rsp, dxp, dws, dws + c, c, b, e);
        });
        T* dwp = dw.data<T>();
        T* dbp = db ? db->data<T>() : nullptr;
        for (int64_t j = 0; j < c; ++j) {
            Store(dwp + j, sums.Sum(j));
            if (dbp) Store(dbp + j, sums.Sum(c + j));
        }
    });
}

void LayerNormKernel(KernelContext& ctx) { NormForward<false, false>(ctx, "layernorm"); }
void LayerNormBackwardKernel(KernelContext& ctx) { NormBackward<false, false>(ctx, "layernorm_backward"); }
void RmsNormKernel(KernelContext& ctx) { NormForward<true, false>(ctx, "rmsnorm"); }
void RmsNormBackwardKernel(KernelContext& ctx) { NormBackward<true, false>(ctx, "rmsnorm_backward"); }
void AddLayerNormKernel(KernelContext& ctx) { NormForward<false, true>(ctx, "add_layernorm"); }
void AddLayerNormBackwardKernel(KernelContext& ctx) { NormBackward<false, true>(ctx, "add_layernorm_backward"); }
void AddRmsNormKernel(KernelContext& ctx) { NormForward<true, true>(ctx, "add_rmsnorm"); }
void AddRmsNormBackwardKernel(KernelContext& ctx) { NormBackward<true, true>(ctx, "add_rmsnorm_backward"); }

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "softmax", SoftmaxKernel);
REGISTER_KERNEL(DeviceType::kCPU, "softmax_backward", SoftmaxBackwardKernel);
REGISTER_KERNEL(DeviceType::kCPU, "log_softmax", LogSoftmaxKernel);
REGISTER_KERNEL(DeviceType::kCPU, "log_softmax_backward", LogSoftmaxBackwardKernel);
REGISTER_KERNEL(DeviceType::kCPU, "layernorm", LayerNormKernel);
REGISTER_KERNEL(DeviceType::kCPU, "layernorm_backward", LayerNormBackwardKernel);
REGISTER_KERNEL(DeviceType::kCPU, "rmsnorm", RmsNormKernel);
REGISTER_KERNEL(DeviceType::kCPU, "rmsnorm_backward", RmsNormBackwardKernel);
REGISTER_KERNEL(DeviceType::kCPU, "add_layernorm", AddLayerNormKernel);
REGISTER_KERNEL(DeviceType::kCPU, "add_layernorm_backward", AddLayerNormBackwardKernel);
REGISTER_KERNEL(DeviceType::kCPU, "add_rmsnorm", AddRmsNormKernel);
REGISTER_KERNEL(DeviceType::kCPU, "add_rmsnorm_backward", AddRmsNormBackwardKernel);

}  // namespace infinitrain::cpu
