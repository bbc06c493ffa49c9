// Attention kernels.
//   rope(x [B, T, H, D], cos [T, D/2], sin [T, D/2], inverse): rotates each pair (x[..., 2i], x[..., 2i+1]) of
//     position t by angle[t, i]: out0 = x0 * cos - x1 * sin, out1 = x0 * sin + x1 * cos (sin negated when inverse,
//     which is also rope's backward).
//   sdpa(q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, D], causal, scale) -> out [B, Hq, T, D], lse [B, Hq, T]:
//     per (b, h), with kv head g = h / (Hq / Hkv) (grouped-query attention):
//     scores = q k^T * scale [T, S], key s > query t masked when causal; lse = log sum exp(scores) per row;
//     P = exp(scores - lse); out = P v. lse is float32, or float64 for float64 inputs.
//   sdpa_backward(grad, q, k, v, out, lse) -> dq, dk, dv: recomputes P from lse, then
//     dv = P^T dO, dP = dO v^T, dS = P * (dP - rowsum(dO * out)), dq = dS k * scale, dk = dS^T q * scale;
//     dk, dv sum over the query heads that share a kv head.
//   sdpa_bthd and its backward: the same on [B, T, H, D] tensors, run on [B, H, T, D] copies.
// The [T, S] products run on OpenBLAS in float32 (float64 for float64 inputs); bfloat16 and float16 heads are widened
// to float32 scratch, except that q k^T and dO v^T of bfloat16 heads take the bf16 kernels (bf16_gemm.h) on the
// tensors themselves where gemm.cc's products do. Work splits over (b, h) forward and over (b, kv head) backward, so
// each thread owns the dk, dv it accumulates; OpenBLAS runs single-threaded inside those parallel loops. Per-thread
// scratch is allocated before the loop, so running out of memory raises MemoryError naming the op (never inside an
// OpenMP region); the bf16 kernels' packing buffers are allocated inside it, and a failure there is carried out of
// the region as a plain MemoryError.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "infinitrain/kernels/cpu/bf16_gemm.h"
#include "infinitrain/kernels/cpu/blas.h"
#include "infinitrain/kernels/cpu/common.h"
#include "infinitrain/kernels/cpu/fastmath.h"

namespace infinitrain::cpu {
namespace {

// The running op's name for errors (sdpa_bthd runs the sdpa kernels on a sub-context of its own op).
const char* OpName(const KernelContext& ctx, const char* fallback) { return ctx.op ? ctx.op->name() : fallback; }

// ---- rope -------------------------------------------------------------------

void RopeKernel(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &cos_t = ctx.in[1], &sin_t = ctx.in[2];
    const Tensor& out = ctx.out[0];
    double sign = ctx.i(0) ? -1.0 : 1.0;
    int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
    if (x.numel() == 0) return;
    DispatchFloat(x.dtype(), "rope", [&](auto tag) {
        using T_ = decltype(tag);
        using S = Acc<T_>;
        const T_* xp = x.data<T_>();
        T_* yp = out.data<T_>();
        const S *cp = cos_t.data<S>(), *sp = sin_t.data<S>();
        ParallelFor(B * T * H, D * 4, [&](int64_t b, int64_t e) {
            for (int64_t row = b; row < e; ++row) {
                int64_t t = (row / H) % T;
                const T_* xr = xp + row * D;
                T_* yr = yp + row * D;
                for (int64_t i = 0; i < half; ++i) {
                    // Products in double are exact for float32 inputs: one rounding per output.
                    double c = cp[t * half + i], s = sign * sp[t * half + i];
                    double x0 = Load(xr + 2 * i), x1 = Load(xr + 2 * i + 1);
                    Store(yr + 2 * i, x0 * c - x1 * s);
                    Store(yr + 2 * i + 1, x0 * s + x1 * c);
                }
            }
        });
    });
}

// ---- sdpa -------------------------------------------------------------------

struct SdpaDims {
    int64_t B, Hq, Hkv, T, S, D;
};

SdpaDims GetDims(const Tensor& q, const Tensor& k) {
    return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
}

// Threads for n items of work_per_item each: one per item when there are enough items, else 1 (serially,
// with Gemm splitting each product's rows).
int HeadThreads(int64_t n, int64_t work_per_item) {
    int64_t nt = omp_get_max_threads();
    if (nt == 1 || n < nt || n * work_per_item < (1 << 16)) return 1;
    return static_cast<int>(nt);
}

// Runs fn(item, worker) for item in [0, n) on `threads` threads; worker (< threads) picks the thread's scratch.
// Exceptions are carried out of the region and rethrown here.
template <typename F>
void ForEachHead(int64_t n, int threads, F&& fn) {
    if (threads == 1) {
        for (int64_t i = 0; i < n; ++i) fn(i, 0);
        return;
    }
    RegionError error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) error.Run([&] { fn(i, omp_get_thread_num()); });
    error.Rethrow();
}

uint64_t MulSat(uint64_t a, uint64_t b) { return b && a > UINT64_MAX / b ? UINT64_MAX : a * b; }

// Per-thread scratch of `per` elements, allocated before the parallel region. When `threads` copies do not
// fit, one thread runs with one copy; if even that fails, OutOfMemory names the op and the score matrix.
template <typename C>
C* HeadScratch(const char* op, const SdpaDims& d, uint64_t per, int* threads, Scratch<C>& s) {
    if (*threads > 1) {
        try {
            s.Allocate(op, "", MulSat(per, *threads));
            return s.get();
        } catch (const std::bad_alloc&) {
            *threads = 1;
        }
    }
    s.Allocate(op,
               "the [T, S] = [" + std::to_string(d.T) + ", " + std::to_string(d.S) + "] attention scores of one head",
               per);
    return s.get();
}

// A [rows, D] block in the compute type: the tensor's memory itself for float32/float64, else widened into buf.
template <typename T, typename C>
const C* Widen(const T* p, int64_t n, C* buf) {
    if constexpr (std::is_same_v<T, C>) {
        return p;
    } else {
        for (int64_t i = 0; i < n; ++i) buf[i] = Load(p + i);
        return buf;
    }
}

template <typename T, typename C>
void StoreBlock(T* dst, const C* src, int64_t n) {
    for (int64_t i = 0; i < n; ++i) Store(dst + i, src[i]);
}

void CheckBlas(const char* op, const SdpaDims& d) {
    for (int64_t v : {d.T, d.S, d.D}) {
        if (v > INT_MAX) OpError(op, "length " + std::to_string(v) + " exceeds the BLAS limit");
    }
}

// out[rows, cols] (row stride ldo) = alpha * x[r0 : r0 + rows, D] @ y[cols, D]^T, for q k^T and dO v^T: on the bf16
// kernels from the bfloat16 heads themselves when sb, else from their compute-type copies xc, yc. serial: on this
// thread (else rows split over the threads outside a parallel region, and ldo must be cols).
template <typename T, typename C>
void ProductXYt(bool sb, bool serial, const T* x, const C* xc, const T* y, const C* yc, int64_t r0, int64_t rows,
                int64_t cols, int64_t D, C alpha, C* out, int64_t ldo) {
    if constexpr (std::is_same_v<T, bf16>) {
        if (sb) {
            const uint16_t *xb = reinterpret_cast<const uint16_t*>(x + r0 * D),
                           *yb = reinterpret_cast<const uint16_t*>(y);
            if (serial) {
                SbGemmSerial(false, true, rows, cols, D, alpha, xb, D, yb, D, 0.0f, out, ldo);
            } else {
                SbGemm(false, true, rows, cols, D, alpha, xb, yb, 0.0f, out);
            }
            return;
        }
    }
    if (serial) {
        GemmSerial<C>(false, true, rows, cols, D, alpha, xc + r0 * D, D, yc, D, C(0), out, ldo);
    } else {
        Gemm<C>(false, true, rows, cols, D, alpha, xc + r0 * D, yc, C(0), out);
    }
}

// The row loops below are built for AVX-512 and AVX2 besides the baseline (fastmath.h), without contraction into
// FMAs, so every build computes the same values.

// Softmax of one row of scores in place: exp(s - max) / sum over [0, n), zeros over [n, len); returns the
// log-sum-exp. The denominator is summed in double.
template <typename C>
INFINITRAIN_SIMD_CLONES __attribute__((optimize("fp-contract=off"))) C SoftmaxRow(C* row, int64_t n, int64_t len) {
    C mx = -INFINITY;
    // A compare, not std::fmax (a libm call per element here); NaN is skipped either way.
#pragma omp simd reduction(max : mx)
    for (int64_t s = 0; s < n; ++s) {
        mx = row[s] > mx ? row[s] : mx;
    }
    // Two loops: exp in the compute type, then the sum in double (mixed widths in one loop do not vectorise).
#pragma omp simd
    for (int64_t s = 0; s < n; ++s) row[s] = Exp(row[s] - mx);
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t s = 0; s < n; ++s) sum += row[s];
    C inv = static_cast<C>(1.0 / sum);
#pragma omp simd
    for (int64_t s = 0; s < n; ++s) row[s] *= inv;
    for (int64_t s = n; s < len; ++s) row[s] = C(0);
    return static_cast<C>(mx + std::log(sum));
}

// Probabilities of one row recomputed from its scores and log-sum-exp l: exp(s - l) over [0, n), zeros after.
template <typename C>
INFINITRAIN_SIMD_CLONES __attribute__((optimize("fp-contract=off"))) void ProbsRow(C* row, int64_t n, int64_t len,
                                                                                   C l) {
#pragma omp simd
    for (int64_t s = 0; s < n; ++s) row[s] = Exp(row[s] - l);
    for (int64_t s = n; s < len; ++s) row[s] = C(0);
}

// dS = P * (dP - rowsum(dO * out)) over [0, n) of one row, in place in dp; the row sum in double.
template <typename C, typename T>
INFINITRAIN_SIMD_CLONES __attribute__((optimize("fp-contract=off"))) void ScoreGradRow(const C* p, C* dp, int64_t n,
                                                                                       const C* go, const T* o,
                                                                                       int64_t D) {
    double di = 0;
#pragma omp simd reduction(+ : di)
    for (int64_t e = 0; e < D; ++e) di += static_cast<double>(go[e]) * static_cast<double>(Load(o + e));
    C dc = static_cast<C>(di);
#pragma omp simd
    for (int64_t s = 0; s < n; ++s) dp[s] = p[s] * (dp[s] - dc);
}

// Causal attention by blocks of query rows: rows [t0, t1) see keys [0, t1) only, so the products skip the
// masked upper triangle (about half the work). Used when heads run one per thread (or on one thread), since
// these products are single-threaded.
constexpr int64_t kCausalBlock = 64;

bool BlockedCausal(bool causal, int threads) { return causal && (threads > 1 || omp_get_max_threads() == 1); }

template <typename T>
void SdpaForward(KernelContext& ctx) {
    using C = Acc<T>;
    const Tensor &q = ctx.in[0], &k = ctx.in[1], &v = ctx.in[2];
    const Tensor &out = ctx.out[0], &lse_t = ctx.out[1];
    bool causal = ctx.i(0) != 0;
    C scale = static_cast<C>(ctx.f(1));
    SdpaDims d = GetDims(q, k);
    int64_t group = d.Hq / d.Hkv;
    const T *qp = q.data<T>(), *kp = k.data<T>(), *vp = v.data<T>();
    T* op = out.data<T>();
    C* lp = lse_t.data<C>();
    constexpr bool kWiden = !std::is_same_v<T, C>;
    const bool sb = std::is_same_v<T, bf16> && UseSbGemm();  // q k^T on the bf16 kernels: q, k stay unwidened
    const uint64_t ts = d.T * d.S, td = d.T * d.D, sd = d.S * d.D;
    int threads = HeadThreads(d.B * d.Hq, d.T * d.S * d.D * 4);
    // Per thread: the scores, plus widened q, k, v and the output for bfloat16/float16.
    const uint64_t per = ts + (kWiden ? 2 * td + 2 * sd : 0);
    Scratch<C> scratch;
    C* base = d.S ? HeadScratch<C>(OpName(ctx, "sdpa"), d, per, &threads, scratch) : nullptr;
    ForEachHead(d.B * d.Hq, threads, [&](int64_t bh, int worker) {
        int64_t b = bh / d.Hq, h = bh % d.Hq, kvh = b * d.Hkv + h / group;
        const T* qh = qp + bh * td;
        T* oh = op + bh * td;
        C* lh = lp + bh * d.T;
        if (d.S == 0) {  // nothing to attend to: zero output, lse = log(0)
            for (uint64_t i = 0; i < td; ++i) Store(oh + i, C(0));
            for (int64_t t = 0; t < d.T; ++t) lh[t] = -INFINITY;
            return;
        }
        C* sc = base + worker * per;
        C *qb = sc + ts, *kb = qb + td, *vb = kb + sd, *ob = vb + sd;
        const T* kh = kp + kvh * sd;
        const C* qc = sb ? nullptr : Widen(qh, td, qb);
        const C* kc = sb ? nullptr : Widen(kh, sd, kb);
        const C* vc = Widen(vp + kvh * sd, sd, vb);
        const bool blocked = BlockedCausal(causal, threads);
        if (blocked) {
            for (int64_t t0 = 0; t0 < d.T; t0 += kCausalBlock) {
                int64_t t1 = std::min(d.T, t0 + kCausalBlock);
                ProductXYt(sb, true, qh, qc, kh, kc, t0, t1 - t0, t1, d.D, scale, sc + t0 * d.S, d.S);
            }
        } else {
            ProductXYt(sb, false, qh, qc, kh, kc, 0, d.T, d.S, d.D, scale, sc, d.S);
        }
        for (int64_t t = 0; t < d.T; ++t) lh[t] = SoftmaxRow(sc + t * d.S, causal ? t + 1 : d.S, d.S);
        C* dst = kWiden ? ob : reinterpret_cast<C*>(oh);
        if (blocked) {
            for (int64_t t0 = 0; t0 < d.T; t0 += kCausalBlock) {
                int64_t t1 = std::min(d.T, t0 + kCausalBlock);
                GemmSerial<C>(false, false, t1 - t0, d.D, t1, C(1), sc + t0 * d.S, d.S, vc, d.D, C(0), dst + t0 * d.D,
                              d.D);
            }
        } else {
            Gemm<C>(false, false, d.T, d.D, d.S, C(1), sc, vc, C(0), dst);
        }
        if constexpr (kWiden) StoreBlock(oh, ob, td);
    });
}

void SdpaKernel(KernelContext& ctx) {
    CheckBlas(OpName(ctx, "sdpa"), GetDims(ctx.in[0], ctx.in[1]));
    DispatchFloat(ctx.in[0].dtype(), "sdpa", [&](auto tag) { SdpaForward<decltype(tag)>(ctx); });
}

// Checks the backward's inputs against each other before touching memory.
void CheckBackwardInputs(const char* op, const std::vector<Tensor>& in, bool causal) {
    const Tensor &q = in[1], &k = in[2], &v = in[3], &o = in[4], &lse = in[5];
    for (int i = 0; i < 5; ++i) {
        if (in[i].dtype() != q.dtype()) {
            OpError(op, std::string("grad, q, k, v and out must share a dtype, got ") + DataTypeName(q.dtype()) +
                            " and " + DataTypeName(in[i].dtype()));
        }
    }
    if (!IsFloating(q.dtype())) {
        OpError(op, std::string("q must be a float tensor, got ") + DataTypeName(q.dtype()));
    }
    if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
        OpError(op, "q, k and v must be 4-d, got " + ShapeToString(q.shape()) + ", " + ShapeToString(k.shape()) +
                        " and " + ShapeToString(v.shape()));
    }
    if (k.shape() != v.shape() || q.size(0) != k.size(0) || q.size(3) != k.size(3) || k.size(1) == 0 ||
        q.size(1) % k.size(1) != 0) {
        OpError(op, "q " + ShapeToString(q.shape()) + ", k " + ShapeToString(k.shape()) + " and v " +
                        ShapeToString(v.shape()) +
                        " must share batch and head dim, with q heads a multiple of k heads and k, v equal");
    }
    if (causal && q.size(2) != k.size(2)) OpError(op, "causal attention needs equal query and key lengths");
    if (o.shape() != q.shape()) {
        OpError(op, "out must have q's shape " + ShapeToString(q.shape()) + ", got " + ShapeToString(o.shape()));
    }
    DataType st = q.dtype() == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32;
    Shape ls{q.size(0), q.size(1), q.size(2)};
    if (lse.dtype() != st || lse.shape() != ls) {
        OpError(op, std::string("lse must be ") + DataTypeName(st) + ShapeToString(ls) + ", got " +
                        DataTypeName(lse.dtype()) + ShapeToString(lse.shape()));
    }
}

template <typename T>
void SdpaBackward(KernelContext& ctx) {
    using C = Acc<T>;
    const Tensor &g = ctx.in[0], &q = ctx.in[1], &k = ctx.in[2], &v = ctx.in[3], &o = ctx.in[4], &lse_t = ctx.in[5];
    const Tensor &dq = ctx.out[0], &dk = ctx.out[1], &dv = ctx.out[2];
    bool causal = ctx.i(0) != 0;
    C scale = static_cast<C>(ctx.f(1));
    SdpaDims d = GetDims(q, k);
    int64_t group = d.Hq / d.Hkv, td = d.T * d.D, sd = d.S * d.D;
    const T *gp = g.data<T>(), *qp = q.data<T>(), *kp = k.data<T>(), *vp = v.data<T>(), *op = o.data<T>();
    const C* lp = lse_t.data<C>();
    T *dqp = dq.data<T>(), *dkp = dk.data<T>(), *dvp = dv.data<T>();
    constexpr bool kWiden = !std::is_same_v<T, C>;
    const bool sb = std::is_same_v<T, bf16> && UseSbGemm();  // q k^T and dO v^T on the bf16 kernels: v unwidened
    const uint64_t ts = d.T * d.S;
    int threads = HeadThreads(d.B * d.Hkv, group * d.T * d.S * d.D * 8);
    // Per thread: P, dP, the dk, dv accumulators, plus widened k, v, q, dO and dq for bfloat16/float16.
    const uint64_t per = 2 * ts + 2 * sd + (kWiden ? 2 * sd + 3 * td : 0);
    Scratch<C> scratch;
    C* base = HeadScratch<C>(OpName(ctx, "sdpa_backward"), d, per, &threads, scratch);
    ForEachHead(d.B * d.Hkv, threads, [&](int64_t bg, int worker) {
        int64_t b = bg / d.Hkv, gh = bg % d.Hkv;
        C *P = base + worker * per, *dP = P + ts, *dkb = dP + ts, *dvb = dkb + sd;
        C *kb = dvb + sd, *vb = kb + sd, *qb = vb + sd, *gb = qb + td, *dqb = gb + td;
        std::fill(dkb, dkb + 2 * sd, C(0));
        const T *kh = kp + bg * sd, *vh = vp + bg * sd;
        const C* kc = Widen(kh, sd, kb);
        const C* vc = sb ? nullptr : Widen(vh, sd, vb);
        for (int64_t j = 0; j < group; ++j) {
            int64_t bh = b * d.Hq + gh * group + j;
            if (d.S == 0) {
                for (int64_t i = 0; i < td; ++i) Store(dqp + bh * td + i, C(0));
                continue;
            }
            const T *qh = qp + bh * td, *doh = gp + bh * td;
            const C* qc = Widen(qh, td, qb);
            const C* gc = Widen(doh, td, gb);
            const T* oh = op + bh * td;
            const C* lh = lp + bh * d.T;
            const bool blocked = BlockedCausal(causal, threads);
            if (blocked) {
                for (int64_t t0 = 0; t0 < d.T; t0 += kCausalBlock) {
                    int64_t t1 = std::min(d.T, t0 + kCausalBlock);
                    ProductXYt(sb, true, qh, qc, kh, kc, t0, t1 - t0, t1, d.D, scale, P + t0 * d.S, d.S);
                }
            } else {
                ProductXYt(sb, false, qh, qc, kh, kc, 0, d.T, d.S, d.D, scale, P, d.S);
            }
            for (int64_t t = 0; t < d.T; ++t) ProbsRow(P + t * d.S, causal ? t + 1 : d.S, d.S, lh[t]);
            if (blocked) {
                for (int64_t t0 = 0; t0 < d.T; t0 += kCausalBlock) {  // dv += P^T dO, dP = dO v^T
                    int64_t t1 = std::min(d.T, t0 + kCausalBlock);
                    GemmSerial<C>(true, false, t1, d.D, t1 - t0, C(1), P + t0 * d.S, d.S, gc + t0 * d.D, d.D, C(1), dvb,
                                  d.D);
                    ProductXYt(sb, true, doh, gc, vh, vc, t0, t1 - t0, t1, d.D, C(1), dP + t0 * d.S, d.S);
                }
            } else {
                Gemm<C>(true, false, d.S, d.D, d.T, C(1), P, gc, C(1), dvb);              // dv += P^T dO
                ProductXYt(sb, false, doh, gc, vh, vc, 0, d.T, d.S, d.D, C(1), dP, d.S);  // dP = dO v^T
            }
            for (int64_t t = 0; t < d.T; ++t) {
                // Masked P is 0, so dS is too; blocked, dP is written (and later read) up to the row block's end.
                int64_t n = blocked ? std::min(d.T, (t / kCausalBlock + 1) * kCausalBlock) : d.S;
                ScoreGradRow(P + t * d.S, dP + t * d.S, n, gc + t * d.D, oh + t * d.D, d.D);
            }
            C* dqdst = kWiden ? dqb : reinterpret_cast<C*>(dqp + bh * td);
            if (blocked) {
                for (int64_t t0 = 0; t0 < d.T; t0 += kCausalBlock) {  // dk += dS^T q * scale, dq = dS k * scale
                    int64_t t1 = std::min(d.T, t0 + kCausalBlock);
                    GemmSerial<C>(true, false, t1, d.D, t1 - t0, scale, dP + t0 * d.S, d.S, qc + t0 * d.D, d.D, C(1),
                                  dkb, d.D);
                    GemmSerial<C>(false, false, t1 - t0, d.D, t1, scale, dP + t0 * d.S, d.S, kc, d.D, C(0),
                                  dqdst + t0 * d.D, d.D);
                }
            } else {
                Gemm<C>(true, false, d.S, d.D, d.T, scale, dP, qc, C(1), dkb);     // dk += dS^T q * scale
                Gemm<C>(false, false, d.T, d.D, d.S, scale, dP, kc, C(0), dqdst);  // dq = dS k * scale
            }
            if constexpr (kWiden) StoreBlock(dqp + bh * td, dqb, td);
        }
        StoreBlock(dkp + bg * sd, dkb, sd);
        StoreBlock(dvp + bg * sd, dvb, sd);
    });
}

void SdpaBackwardKernel(KernelContext& ctx) {
    const char* op = OpName(ctx, "sdpa_backward");
    // The backward meta checks only the attribute count.
    if (!std::holds_alternative<int64_t>(ctx.attrs[0])) OpError(op, "attribute 'causal' must be an int");
    if (std::holds_alternative<std::vector<int64_t>>(ctx.attrs[1]) ||
        std::holds_alternative<std::string>(ctx.attrs[1])) {
        OpError(op, "attribute 'scale' must be a float");
    }
    CheckBackwardInputs(op, ctx.in, ctx.i(0) != 0);
    CheckBlas(op, GetDims(ctx.in[1], ctx.in[2]));
    DispatchFloat(ctx.in[1].dtype(), "sdpa_backward", [&](auto tag) { SdpaBackward<decltype(tag)>(ctx); });
}

// x [B, I, J, D] with dims 1 and 2 swapped, by permute's kernel, into y [B, J, I, D] (a new tensor when y is null).
Tensor SwapMiddle(const KernelContext& ctx, const Tensor& x, const Tensor* y = nullptr) {
    const Shape& s = x.shape();
    std::vector<Tensor> out = {y ? *y : Tensor::Empty({s[0], s[2], s[1], s[3]}, x.dtype(), x.device())};
    RunKernelOf("permute", ctx, {x}, out, {std::vector<int64_t>{0, 2, 1, 3}});
    return out[0];
}

void SdpaBthdKernel(KernelContext& ctx) {
    std::vector<Tensor> in = {SwapMiddle(ctx, ctx.in[0]), SwapMiddle(ctx, ctx.in[1]), SwapMiddle(ctx, ctx.in[2])};
    std::vector<Tensor> out = {Tensor::Empty(in[0].shape(), in[0].dtype(), in[0].device()), ctx.out[1]};
    KernelContext sub{in, out, ctx.attrs, ctx.device, ctx.stream, ctx.op};
    SdpaKernel(sub);
    SwapMiddle(ctx, out[0], &ctx.out[0]);
}

void SdpaBthdBackwardKernel(KernelContext& ctx) {
    std::vector<Tensor> in;
    for (int k = 0; k < 5; ++k) in.push_back(SwapMiddle(ctx, ctx.in[k]));
    in.push_back(ctx.in[5]);
    std::vector<Tensor> out;
    for (int k = 1; k < 4; ++k) out.push_back(Tensor::Empty(in[k].shape(), in[k].dtype(), in[k].device()));
    KernelContext sub{in, out, ctx.attrs, ctx.device, ctx.stream, ctx.op};
    SdpaBackwardKernel(sub);
    for (int k = 0; k < 3; ++k) SwapMiddle(ctx, out[k], &ctx.out[k]);
}

}  // namespace

REGISTER_KERNEL(DeviceType::kCPU, "rope", RopeKernel);
REGISTER_KERNEL(DeviceType::kCPU, "sdpa", SdpaKernel);
REGISTER_KERNEL(DeviceType::kCPU, "sdpa_backward", SdpaBackwardKernel);
REGISTER_KERNEL(DeviceType::kCPU, "sdpa_bthd", SdpaBthdKernel);
REGISTER_KERNEL(DeviceType::kCPU, "sdpa_bthd_backward", SdpaBthdBackwardKernel);

}  // namespace infinitrain::cpu
