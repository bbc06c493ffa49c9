// Softmax and normalisation layers.
//   softmax / log_softmax(x, dim) and their backwards view x as (outer, n, inner) with n = x.shape[dim]:
//     inner == 1: rows of n contiguous elements, a 32-lane group per row (n <= 1024) or a block per row;
//     inner > 1: a thread per column (o, i), walking n with stride inner (coalesced across threads).
//     The row max is subtracted before exp (max ignores NaN, as the CPU's fmax; a NaN still reaches the sum).
//     softmax_backward(out, grad): dx = out * (grad - sum(grad * out)); log_softmax_backward: grad - exp(out)
//     sum(grad).
//   layernorm(x [R, C], weight, bias): per row (a block) mean, then the biased variance of x - mean (two passes),
//     rstd = 1 / sqrt(var + eps); out = (x - mean) * rstd * weight + bias. rmsnorm: rstd = 1 / sqrt(mean(x^2) + eps),
//     out = x * rstd * weight. The backwards recompute xhat from the saved mean / rstd:
//     dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) (rmsnorm without mean(dxhat)),
//     dweight = sum over rows of grad * xhat, dbias = sum of grad, as partial sums over fixed chunks of rows
//     combined in chunk order, so the sums are deterministic.
//   add_layernorm / add_rmsnorm(x, a, ...): sum = x + a rounded to x's type, then the norm of sum, out in its own
//     type (16-bit for float32 x under autocast); their backwards read a 16-bit grad for float32 x and add the
//     residual gradient to dx: for float32 after dx's rounding (the bits of the norm's backward and an add apart),
//     for 16-bit x before its one rounding.
//   Rows of C <= 1024 take a 32-lane group each, the row in registers (read once, shuffles only); longer rows a
//   block per row. The parameter gradients are a column pass over fixed row chunks and a parallel combine.
// Precision: softmax sums in the compute type (float for float32/bfloat16/float16, double for float64); the
// norms' row statistics in double, stored as float32 (float64 for float64 x). dweight / dbias accumulate in double.
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

// ---- softmax family -----------------------------------------------------------------

// Sums of a row (len elements at stride 1) over `width` cooperating threads at position pos; `Reduce` combines
// the threads' partials (a group or a block reduction).
template <bool kLog, typename T, typename ReduceMax, typename ReduceSum>
__device__ __forceinline__ void SoftmaxRow(const T* x, T* y, int64_t len, int pos, int width, ReduceMax rmax,
                                           ReduceSum rsum) {
    using V = Acc<T>;
    V mx = -INFINITY;
    for (int64_t j = pos; j < len; j += width) mx = Fmax(mx, ToAcc(x[j]));
    mx = rmax(mx);
    V sum = 0;
    for (int64_t j = pos; j < len; j += width) sum += Exp(ToAcc(x[j]) - mx);
    sum = rsum(sum);
    if (kLog) {
        // (x - max) - log(sum), not x - (max + log(sum)): the latter rounds at |x|'s magnitude (1e4 loses 3 digits).
        const V lse = Log(sum);
        for (int64_t j = pos; j < len; j += width) y[j] = FromAcc<T>((ToAcc(x[j]) - mx) - lse);
    } else {
        const V inv = V(1) / sum;
        for (int64_t j = pos; j < len; j += width) y[j] = FromAcc<T>(Exp(ToAcc(x[j]) - mx) * inv);
    }
}

template <bool kLog, typename T, typename Reduce>
__device__ __forceinline__ void SoftmaxBackwardRow(const T* y, const T* g, T* dx, int64_t len, int pos, int width,
                                                   Reduce rsum) {
    using V = Acc<T>;
    V s = 0;
    for (int64_t j = pos; j < len; j += width) s += kLog ? ToAcc(g[j]) : ToAcc(g[j]) * ToAcc(y[j]);
    s = rsum(s);
    for (int64_t j = pos; j < len; j += width) {
        const V yv = ToAcc(y[j]), gv = ToAcc(g[j]);
        dx[j] = FromAcc<T>(kLog ? gv - Exp(yv) * s : yv * (gv - s));
    }
}

struct GroupMax {
    template <typename V>
    __device__ V operator()(V v) const {
        return GroupReduce(v, FmaxOp());
    }
};
struct GroupSum {
    template <typename V>
    __device__ V operator()(V v) const {
        return GroupReduce(v, SumOp());
    }
};
struct BlockMax {
    template <typename V>
    __device__ V operator()(V v) const {
        return BlockReduce(v, FmaxOp(), V(-INFINITY));
    }
};
struct BlockSum {
    template <typename V>
    __device__ V operator()(V v) const {
        return BlockReduce(v, SumOp(), V(0));
    }
};

// Rows of len contiguous elements: 32-lane groups (kBlock false) or whole blocks (true) per row. Loops run the
// same number of times in every thread of a block, so reductions always see their whole group or block.
template <bool kLog, bool kBlock, typename T>
__global__ void SoftmaxRowsKernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t len) {
    const int per_block = kBlock ? 1 : blockDim.x / kGroup;
    const int64_t sub = kBlock ? 0 : threadIdx.x / kGroup;
    const int pos = kBlock ? threadIdx.x : threadIdx.x % kGroup, width = kBlock ? blockDim.x : kGroup;
    GPU_BLOCK_ROWS_LOOP(base, rows, per_block) {
        const int64_t row = base + sub;
        const int64_t n = row < rows ? len : 0;  // a group past the end still joins its warp's shuffles
        const int64_t r = row < rows ? row : 0;
        if (kBlock) {
            SoftmaxRow<kLog>(x + r * len, y + r * len, n, pos, width, BlockMax(), BlockSum());
        } else {
            SoftmaxRow<kLog>(x + r * len, y + r * len, n, pos, width, GroupMax(), GroupSum());
        }
    }
}

template <bool kLog, bool kBlock, typename T>
__global__ void SoftmaxBackwardRowsKernel(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx,
                                          int64_t rows, int64_t len) {
    const int per_block = kBlock ? 1 : blockDim.x / kGroup;
    const int64_t sub = kBlock ? 0 : threadIdx.x / kGroup;
    const int pos = kBlock ? threadIdx.x : threadIdx.x % kGroup, width = kBlock ? blockDim.x : kGroup;
    GPU_BLOCK_ROWS_LOOP(base, rows, per_block) {
        const int64_t row = base + sub;
        const int64_t n = row < rows ? len : 0;
        const int64_t r = (row < rows ? row : 0) * len;
        if (kBlock) {
            SoftmaxBackwardRow<kLog>(y + r, g + r, dx + r, n, pos, width, BlockSum());
        } else {
            SoftmaxBackwardRow<kLog>(y + r, g + r, dx + r, n, pos, width, GroupSum());
        }
    }
}

// inner > 1: thread t owns column (o, i) of (outer, n, inner).
template <bool kLog, typename T>
__global__ void SoftmaxColsKernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner) {
    using V = Acc<T>;
    GPU_KERNEL_LOOP(t, outer * inner) {
        const int64_t base = (t / inner) * n * inner + t % inner;
        V mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) mx = Fmax(mx, ToAcc(x[base + j * inner]));
        V sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += Exp(ToAcc(x[base + j * inner]) - mx);
        if (kLog) {
            const V lse = Log(sum);
            for (int64_t j = 0; j < n; ++j) y[base + j * inner] = FromAcc<T>((ToAcc(x[base + j * inner]) - mx) - lse);
        } else {
            const V inv = V(1) / sum;
            for (int64_t j = 0; j < n; ++j)
                y[base + j * inner] = FromAcc<T>(Exp(ToAcc(x[base + j * inner]) - mx) * inv);
        }
    }
}

template <bool kLog, typename T>
__global__ void SoftmaxBackwardColsKernel(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx,
                                          int64_t outer, int64_t n, int64_t inner) {
    using V = Acc<T>;
    GPU_KERNEL_LOOP(t, outer * inner) {
        const int64_t base = (t / inner) * n * inner + t % inner;
        V s = 0;
        for (int64_t j = 0; j < n; ++j) {
            const int64_t k = base + j * inner;
            s += kLog ? ToAcc(g[k]) : ToAcc(g[k]) * ToAcc(y[k]);
        }
        for (int64_t j = 0; j < n; ++j) {
            const int64_t k = base + j * inner;
            const V yv = ToAcc(y[k]), gv = ToAcc(g[k]);
            dx[k] = FromAcc<T>(kLog ? gv - Exp(yv) * s : yv * (gv - s));
        }
    }
}

// ---- layernorm / rmsnorm -------------------------------------------------------------------

// One block per row (grid-stride over rows). mean is null for rmsnorm (and bias with it). The row statistics
// accumulate in double: squares of |x| ~ 1e20 overflow float, and an offset of 1e4 over a spread of 1e-2 loses the
// variance to cancellation unless the mean is exact to far below float's rounding (x - mean is taken in double too).
// With a (add_layernorm, add_rmsnorm: a of type Y), the row of x + a is first rounded to T into sum (each thread
// writes and later reads back the same columns) and normalised from there; out is O.
template <bool kRms, typename T, typename Y, typename O>
__global__ void NormForwardKernel(const T* __restrict__ x, const Y* __restrict__ a, T* __restrict__ sum,
                                  const T* __restrict__ w, const T* __restrict__ b, O* __restrict__ y,
                                  Acc<T>* __restrict__ mean_out, Acc<T>* __restrict__ rstd_out, int64_t rows, int64_t C,
                                  double eps) {
    using V = Acc<T>;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * C;
        if (a) {
            const Y* ar = a + r * C;
            T* sr = sum + r * C;
            for (int64_t j = threadIdx.x; j < C; j += blockDim.x) sr[j] = FromAcc<T>(ToAcc(xr[j]) + ToAcc(ar[j]));
            xr = sr;
        }
        double mean = 0;
        if (!kRms) {
            double s = 0;
            for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += static_cast<double>(ToAcc(xr[j]));
            s = BlockReduce(s, SumOp(), 0.0);
            mean = C ? s / static_cast<double>(C) : 0.0;
        }
        double q = 0;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
            const double d = static_cast<double>(ToAcc(xr[j])) - mean;
            q += d * d;
        }
        q = BlockReduce(q, SumOp(), 0.0);
        const double var = C ? q / static_cast<double>(C) : 0.0;
        const V rstd = static_cast<V>(1.0 / Sqrt(var + eps));
        O* yr = y + r * C;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
            V v = static_cast<V>(static_cast<double>(ToAcc(xr[j])) - mean) * rstd * ToAcc(w[j]);
            if (!kRms) v += ToAcc(b[j]);
            yr[j] = FromAcc<O>(v);
        }
        if (threadIdx.x == 0) {
            if (!kRms) mean_out[r] = static_cast<V>(mean);
            rstd_out[r] = rstd;
        }
    }
}

// dx per row (one block per row); mean is null for rmsnorm. g is G (T, or 16-bit for float32 T); res, when not
// null, is added to dx before its rounding (add_layernorm_backward).
template <bool kRms, typename T, typename G>
__global__ void NormBackwardDxKernel(const G* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                                     const Acc<T>* __restrict__ mean_in, const Acc<T>* __restrict__ rstd_in,
                                     const T* __restrict__ res, T* __restrict__ dx, int64_t rows, int64_t C) {
    using V = Acc<T>;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const G* gr = g + r * C;
        const T* xr = x + r * C;
        const V mean = kRms ? V(0) : mean_in[r], rstd = rstd_in[r];
        V sd = 0, sdx = 0;  // sums of dxhat and dxhat * xhat
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
            const V xh = (ToAcc(xr[j]) - mean) * rstd, d = MulRn(static_cast<V>(ToAcc(gr[j])), ToAcc(w[j]));
            sd += d;
            sdx += d * xh;
        }
        if (!kRms) sd = BlockReduce(sd, SumOp(), V(0));
        sdx = BlockReduce(sdx, SumOp(), V(0));
        const V mean_d = kRms ? V(0) : sd / static_cast<V>(C), mean_dx = sdx / static_cast<V>(C);
        T* dr = dx + r * C;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
            const V xh = (ToAcc(xr[j]) - mean) * rstd, d = MulRn(static_cast<V>(ToAcc(gr[j])), ToAcc(w[j]));
            // The product rounded on its own (no FMA with res): the bits of the norm's backward, then an add.
            V v = MulRn(rstd, d - mean_d - xh * mean_dx);
            if (res) v += ToAcc(res[r * C + j]);
            dr[j] = FromAcc<T>(v);
        }
    }
}

// Thread t owns column c = t % C over rows [p * chunk, (p + 1) * chunk), p = t / C: partial[p * W + c] = sum of
// grad * xhat and partial[p * W + C + c] = sum of grad (dbias; skipped for rmsnorm), W = C or 2C.
template <bool kRms, typename T, typename G>
__global__ void NormBackwardParamsKernel(const G* __restrict__ g, const T* __restrict__ x,
                                         const Acc<T>* __restrict__ mean_in, const Acc<T>* __restrict__ rstd_in,
                                         double* __restrict__ partial, int64_t rows, int64_t C, int64_t P,
                                         int64_t chunk) {
    GPU_KERNEL_LOOP(t, P * C) {
        const int64_t p = t / C, c = t % C;
        const int64_t r0 = p * chunk, r1 = min(rows, r0 + chunk);
        double sw = 0, sb = 0;
        // Unrolled so that several rows' loads are in flight (the sums stay in row order).
#pragma unroll 8
        for (int64_t r = r0; r < r1; ++r) {
            const double mean = kRms ? 0.0 : static_cast<double>(mean_in[r]);
            const double gv = ToAcc(g[r * C + c]), xh = (ToAcc(x[r * C + c]) - mean) * rstd_in[r];
            sw += gv * xh;
            sb += gv;
        }
        const int64_t W = kRms ? C : 2 * C;
        partial[p * W + c] = sw;
        if (!kRms) partial[p * W + C + c] = sb;
    }
}

// ---- rows of up to 32 * kPer elements: a 32-lane group per row ----------------------------------------------

// Lane l of a group holds columns l, l + 32, ... of its row. Groups past the last row still run every shuffle
// (two groups share a 64-lane hardware warp), with nothing loaded or stored. a and sum as NormForwardKernel's.
template <bool kRms, int kPer, typename T, typename Y, typename O>
__global__ void __launch_bounds__(kThreads, sizeof(T) < 8 && kPer <= 24 ? 3 : 1)
    NormForwardGroupKernel(const T* __restrict__ x, const Y* __restrict__ a, T* __restrict__ sum,
                           const T* __restrict__ w, const T* __restrict__ b, O* __restrict__ y,
                           Acc<T>* __restrict__ mean_out, Acc<T>* __restrict__ rstd_out, int64_t rows, int64_t C,
                           double eps) {
    using V = Acc<T>;
    const int lane = threadIdx.x % kGroup;
    const int64_t per_block = blockDim.x / kGroup;
    GPU_BLOCK_ROWS_LOOP(base, rows, per_block) {
        const int64_t r = base + threadIdx.x / kGroup;
        const bool live = r < rows;
        const int64_t r0 = (live ? r : 0) * C;
        V xv[kPer];
        double s = 0;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            const int64_t j = lane + k * kGroup;
            xv[k] = V(0);
            if (live && j < C) {
                if (a) {
                    const T v = FromAcc<T>(ToAcc(x[r0 + j]) + ToAcc(a[r0 + j]));
                    sum[r0 + j] = v;
                    xv[k] = ToAcc(v);
                } else {
                    xv[k] = ToAcc(x[r0 + j]);
                }
            }
            s += static_cast<double>(xv[k]);
        }
        double mean = 0;
        if (!kRms) mean = C ? GroupReduce(s, SumOp()) / static_cast<double>(C) : 0.0;
        double q = 0;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            const double d = lane + k * kGroup < C ? static_cast<double>(xv[k]) - mean : 0.0;
            q += d * d;
        }
        q = GroupReduce(q, SumOp());
        const double var = C ? q / static_cast<double>(C) : 0.0;
        const V rstd = static_cast<V>(1.0 / Sqrt(var + eps));
        if (!live) continue;
        O* yr = y + r * C;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            const int64_t j = lane + k * kGroup;
            if (j >= C) break;
            V v = static_cast<V>(static_cast<double>(xv[k]) - mean) * rstd * ToAcc(w[j]);
            if (!kRms) v += ToAcc(b[j]);
            yr[j] = FromAcc<O>(v);
        }
        if (lane == 0) {
            if (!kRms) mean_out[r] = static_cast<V>(mean);
            rstd_out[r] = rstd;
        }
    }
}

// Whether NormBackwardGroupKernel keeps its per-column parameter sums in shared memory rather than registers (8
// groups x kPer x 32 floats, twice for layernorm: 48 KiB at kPer = 24): the registers then hold only the row, so
// three blocks fit an SM instead of two.
template <typename V, int kPer, bool kParams>
constexpr bool kNormSumsShared = kParams && sizeof(V) == 4 && kPer <= 24;

// dx of a row per 32-lane group (grid-stride over rows: lane l holds columns l, l + 32, ...). With kParams, the
// parameter gradients in the same pass over g and x: lane l adds its columns' grad * xhat and grad over the group's
// rows in float32 (in registers, or its own slots of shared memory: kNormSumsShared), the block's 8 groups are
// summed in a fixed order (double) through shared memory, and block b writes partial[b * W + c] (W = C, or 2C with
// layernorm's dbias after dweight) for NormParamsCombineKernel. g is G and res as NormBackwardDxKernel's.
template <bool kRms, int kPer, typename T, typename G, bool kParams>
__global__ void __launch_bounds__(kThreads, kNormSumsShared<Acc<T>, kPer, kParams> ? 3
                                            : sizeof(T) < 8 && kPer <= 24          ? 2
                                                                                   : 1)
    NormBackwardGroupKernel(const G* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                            const Acc<T>* __restrict__ mean_in, const Acc<T>* __restrict__ rstd_in,
                            const T* __restrict__ res, T* __restrict__ dx, double* __restrict__ partial, int64_t rows,
                            int64_t C) {
    using V = Acc<T>;
    constexpr int kGroups = kThreads / kGroup;
    constexpr bool kShared = kNormSumsShared<V, kPer, kParams>;
    constexpr int kSlots = kPer * kGroup;
    // kShared: the running sums (dweight's, then dbias's); else the registers' sums, copied here at the end.
    __shared__ V acc_s[kParams ? kGroups : 1][kParams ? kSlots : 1];
    __shared__ V accb_s[kShared && !kRms ? kGroups : 1][kShared && !kRms ? kSlots : 1];
    const int lane = threadIdx.x % kGroup, grp = threadIdx.x / kGroup;
    V aw[kShared ? 1 : kPer], ab[kShared ? 1 : kPer];
    if constexpr (kShared) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            acc_s[grp][lane + k * kGroup] = V(0);
            if (!kRms) accb_s[grp][lane + k * kGroup] = V(0);
        }
    } else {
#pragma unroll
        for (int k = 0; k < kPer; ++k) aw[k] = ab[k] = V(0);
    }
    GPU_BLOCK_ROWS_LOOP(base, rows, kGroups) {
        const int64_t r = base + grp;
        const bool live = r < rows;
        const int64_t rr = live ? r : 0;
        const G* gr = g + rr * C;
        const T* xr = x + rr * C;
        const V mean = kRms ? V(0) : mean_in[rr], rstd = rstd_in[rr];
        V d[kPer], xh[kPer];
        V sd = 0, sdx = 0;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            const int64_t j = lane + k * kGroup;
            d[k] = xh[k] = V(0);
            if (live && j < C) {
                const V gv = static_cast<V>(ToAcc(gr[j]));
                xh[k] = (ToAcc(xr[j]) - mean) * rstd;
                d[k] = MulRn(gv, ToAcc(w[j]));
                sd += d[k];
                sdx += d[k] * xh[k];
                if constexpr (kShared) {  // each lane its own slots: no other thread reads them until the end
                    acc_s[grp][lane + k * kGroup] += gv * xh[k];
                    if (!kRms) accb_s[grp][lane + k * kGroup] += gv;
                } else if (kParams) {
                    aw[k] += gv * xh[k];
                    ab[k] += gv;
                }
            }
        }
        if (!kRms) sd = GroupReduce(sd, SumOp());
        sdx = GroupReduce(sdx, SumOp());
        if (!live) continue;
        const V mean_d = kRms ? V(0) : sd / static_cast<V>(C), mean_dx = sdx / static_cast<V>(C);
        T* dr = dx + r * C;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            const int64_t j = lane + k * kGroup;
            if (j >= C) break;
            V v = MulRn(rstd, d[k] - mean_d - xh[k] * mean_dx);  // as NormBackwardDxKernel's
            if (res) v += ToAcc(res[r * C + j]);
            dr[j] = FromAcc<T>(v);
        }
    }
    if (!kParams) return;
    const int64_t W = kRms ? C : 2 * C;
    for (int part = 0; part < (kRms ? 1 : 2); ++part) {
        if constexpr (!kShared) {
#pragma unroll
            for (int k = 0; k < kPer; ++k) acc_s[grp][lane + k * kGroup] = part == 0 ? aw[k] : ab[k];
        }
        __syncthreads();
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            double t = 0;
#pragma unroll
            for (int i = 0; i < kGroups; ++i) {
                t += static_cast<double>(kShared && part == 1 ? accb_s[kRms ? 0 : i][kRms ? 0 : c] : acc_s[i][c]);
            }
            partial[blockIdx.x * W + part * C + c] = t;
        }
        __syncthreads();
    }
}

// out[c] = sum over p < P of partial[p * W + c] in a fixed order: a block of 32 x 32 threads per 32 columns,
// thread (c, y) summing p = y, y + 32, ..., then the 32 sums added in y order. Columns c < C go to dw, the
// rest (layernorm's) to db.
template <typename T>
__global__ void NormParamsCombineKernel(const double* __restrict__ partial, T* __restrict__ dw, T* __restrict__ db,
                                        int64_t C, int64_t W, int64_t P) {
    __shared__ double buf[32][33];
    const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
    double s = 0;
    if (c < W) {
        for (int64_t p = threadIdx.y; p < P; p += 32) s += partial[p * W + c];
    }
    buf[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < W) {
        double t = 0;
        for (int k = 0; k < 32; ++k) t += buf[k][threadIdx.x];
        if (c < C) {
            dw[c] = FromAcc<T>(static_cast<Acc<T>>(t));
        } else {
            db[c - C] = FromAcc<T>(static_cast<Acc<T>>(t));
        }
    }
}

}  // namespace infinitrain::gpu
