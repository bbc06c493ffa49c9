// Matrix products for the CPU kernels, on OpenBLAS (CBLAS, row-major): the scipy-openblas32 wheel's build,
// whose symbols carry a scipy_ prefix (toolchains/openblas).
// OpenBLAS runs single-threaded (set once when the library loads): its thread
// pool and OpenMP's spinning workers otherwise fight over the cores, which cost
// up to 4x on a 2-core machine. Kernels parallelise with OpenMP instead; Gemm
// itself splits the rows of C across threads when called outside a parallel
// region. bfloat16 products on the CPU's bf16 units: bf16_gemm.h (the wheel's
// build has no sbgemm).
#pragma once

#include <omp.h>
#include <scipy_openblas/cblas.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "infinitrain/op.h"

namespace infinitrain::cpu {

// CBLAS takes int dimensions: larger ones are refused, naming the op.
inline void CheckBlasSize(const char* op, std::initializer_list<int64_t> dims) {
    for (int64_t d : dims) {
        if (d > INT_MAX)
            OpError(op, "matrix dimension " + std::to_string(d) + " exceeds the BLAS limit " + std::to_string(INT_MAX));
    }
}

// C[M, N] = alpha * op(A) @ op(B) + beta * C on one thread, explicit leading dimensions.
template <typename C>
void GemmSerial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, C alpha, const C* a, int64_t lda, const C* b,
                int64_t ldb, C beta, C* c, int64_t ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // BLAS rejects K == 0 (lda 0)
        for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == C(0) ? C(0) : beta * c[i * ldc + j];
        }
        return;
    }
    CBLAS_TRANSPOSE oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<C, float>) {
        scipy_cblas_sgemm(CblasRowMajor, oa, ob, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha,
                          a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
    } else {
        scipy_cblas_dgemm(CblasRowMajor, oa, ob, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha,
                          a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
    }
}

// The grid of C blocks, pm x pn <= threads, for a threaded product: each block's call packs its rows of op(A) and
// its columns of op(B) afresh, so the grid minimises the packed panels' total, pn * M + pm * N (times K), with
// blocks at least 16 rows and 16 columns. The most blocks that some grid allows: 16 threads over a 200 x 20 C take
// 12 x 1, as no 16-block grid fits. False when no grid but 1 x 1 qualifies.
inline bool GemmGrid(int64_t m, int64_t n, int threads, int* pm, int* pn) {
    for (int t = threads; t > 1; --t) {
        int64_t best = -1;
        for (int r = 1; r <= t; ++r) {
            int c = t / r;
            if (r * c != t || (r > 1 && m < 16 * r) || (c > 1 && n < 16 * c)) continue;
            int64_t cost = c * m + r * n;
            if (best < 0 || cost < best) best = cost, *pm = r, *pn = c;
        }
        if (best >= 0) return true;
    }
    return false;
}

// C[M, N] = alpha * op(A) @ op(B) + beta * C for contiguous operands: A stored [M, K] ([K, M] when ta), B stored
// [K, N] ([N, K] when tb). Large products outside a parallel region split C into a grid of blocks, one per thread
// (GemmGrid); splitting rows only made every thread pack all of op(B).
template <typename C>
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, C alpha, const C* a, const C* b, C beta, C* c) {
    int64_t lda = ta ? m : k, ldb = tb ? k : n;
    int nt = omp_get_max_threads(), pm = 1, pn = 1;
    if (nt == 1 || omp_in_parallel() || m * n * k < (int64_t{1} << 18) || !GemmGrid(m, n, nt, &pm, &pn)) {
        GemmSerial(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
        return;
    }
    const int blocks = pm * pn;
    const int64_t rows = (m + pm - 1) / pm, cols = (n + pn - 1) / pn;
#pragma omp parallel num_threads(blocks)
    {
        // A loop, not one block per thread: the runtime may start fewer threads than asked for.
        for (int64_t blk = omp_get_thread_num(); blk < blocks; blk += omp_get_num_threads()) {
            int64_t i0 = blk / pn * rows, i1 = std::min(m, i0 + rows), j0 = blk % pn * cols,
                    j1 = std::min(n, j0 + cols);
            // Rows i0..i1 of op(A): a row offset in A, or a column offset when A is stored transposed; columns
            // j0..j1 of op(B) likewise.
            if (i0 < i1 && j0 < j1) {
                GemmSerial(ta, tb, i1 - i0, j1 - j0, k, alpha, ta ? a + i0 : a + i0 * k, lda, tb ? b + j0 * k : b + j0,
                           ldb, beta, c + i0 * n + j0, n);
            }
        }
    }
}

}  // namespace infinitrain::cpu
