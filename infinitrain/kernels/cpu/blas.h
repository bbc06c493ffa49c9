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

#include <cstdint>
#include <type_traits>

namespace infinitrain::cpu {

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

// C[M, N] = alpha * op(A) @ op(B) + beta * C for contiguous operands: A stored [M, K] ([K, M] when ta), B stored
// [K, N] ([N, K] when tb). Large products outside a parallel region split C's rows across threads.
template <typename C>
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, C alpha, const C* a, const C* b, C beta, C* c) {
    int64_t lda = ta ? m : k, ldb = tb ? k : n;
    int nt = omp_get_max_threads();
    if (nt == 1 || omp_in_parallel() || m < 2 * nt || m * n * k < (int64_t{1} << 18)) {
        GemmSerial(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
        return;
    }
#pragma omp parallel
    {
        int64_t t = omp_get_thread_num(), parts = omp_get_num_threads();
        int64_t chunk = (m + parts - 1) / parts, i0 = t * chunk, i1 = i0 + chunk < m ? i0 + chunk : m;
        // Rows i0..i1 of op(A): a row offset in A, or a column offset when A is stored transposed.
        if (i0 < i1) {
            GemmSerial(ta, tb, i1 - i0, n, k, alpha, ta ? a + i0 : a + i0 * k, lda, b, ldb, beta, c + i0 * n, n);
        }
    }
}

}  // namespace infinitrain::cpu
