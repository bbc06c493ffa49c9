// bfloat16 GEMMs on the CPU's bf16 dot-product units (float32 products, float32 sums).
// The wheel's OpenBLAS is built without BUILD_BFLOAT16 (its cblas.h declares scipy_cblas_sbgemm, the library
// has no such symbol), so these kernels are the project's own: AMX-BF16 tiles, else AVX512_BF16's vdpbf16ps,
// else plain C++ on the same packed layout (a reference that runs on any CPU).
#pragma once

#include <cstdint>

namespace infinitrain::cpu {

// Whether bfloat16 matmul, linear and sdpa multiply on these kernels instead of widening to float32 for sgemm.
// INFINITRAIN_CPU_BF16_GEMM: auto (the default: where the CPU has AMX-BF16), sbgemm (always, on the best kernel
// this CPU runs), widen (never), or amx, avx512bf16, generic (that kernel). Read once; an invalid value throws
// std::invalid_argument. Call outside OpenMP regions.
bool UseSbGemm();

// C[M, N] = alpha * op(A) @ op(B) + beta * C with bfloat16 A, B (their bit patterns) and float32 C, on one
// thread, explicit leading dimensions: A stored [M, K] ([K, M] when ta), B stored [K, N] ([N, K] when tb).
// beta == 0 ignores C's contents, as BLAS does.
void SbGemmSerial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                  const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same for contiguous operands (ldc = N). Large products outside a parallel region split C's rows across
// threads, as Gemm does, sharing one packed copy of B.
void SbGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, const uint16_t* b,
            float beta, float* c);

// The same into a bfloat16 C, each element rounded once from float32: C = alpha * op(A) @ op(B) + bias, with an
// optional bfloat16 bias [N] added to every row. Saves the float32 scratch and the pass that narrows it.
void SbGemmBf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, const uint16_t* b,
                const uint16_t* bias, uint16_t* c);

}  // namespace infinitrain::cpu
