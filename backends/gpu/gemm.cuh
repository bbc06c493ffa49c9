// Row-major matrix products on the vendor BLAS (column-major), and the bias
// of linear (broadcast into the output, or added to a float32 product).
//
// Layout: C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C, A stored
// [m, k] ([k, m] when transposed), B stored [k, n] ([n, k] when transposed),
// all row-major; batches at element strides (0 repeats one matrix). A
// row-major matrix is its column-major transpose, so the BLAS computes
// C^T = op(B)^T @ op(A)^T with the operands swapped and no data moved.
//
// Precision: float32, bfloat16 and float16 accumulate in float32 (TF32 only
// when the vendor header enables it) and round once into C, which is the
// operands' type or float32; float64 is a double GEMM. k == 0 writes
// beta * C without calling the BLAS (which rejects it on some vendors).
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

template <typename T>
constexpr BlasType BlasTypeOf() {
    return std::is_same<T, bf16_t>::value ? BlasType::kBFloat16
                                          : (std::is_same<T, fp16_t>::value ? BlasType::kFloat16 : BlasType::kFloat32);
}

inline int BlasInt(const char* op, int64_t v) {
    if (v > INT_MAX) {
        OpError(op, "matrix dimension " + std::to_string(v) + " exceeds the BLAS limit " + std::to_string(INT_MAX));
    }
    return static_cast<int>(v);
}

// C_i = alpha * op(A_i) @ op(B_i) + beta * C_i for i < batch; beta is 0 or 1. T is the operands' storage type,
// C float32 or T (double with double).
template <typename T, typename C>
void RowMajorGemm(const char* op, BlasHandle h, NativeStream_t s, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                  double alpha, const T* a, int64_t stride_a, const T* b, int64_t stride_b, double beta, C* c,
                  int64_t stride_c, int64_t batch) {
    if (m == 0 || n == 0 || batch == 0) return;
    if (k == 0) {
        if (beta == 0.0 && stride_c == m * n) {
            MemsetAsync(c, 0, sizeof(C) * m * n * batch, s);
        } else if (beta == 0.0) {
            for (int64_t i = 0; i < batch; ++i) MemsetAsync(c + i * stride_c, 0, sizeof(C) * m * n, s);
        }
        return;
    }
    const int M = BlasInt(op, m), N = BlasInt(op, n), K = BlasInt(op, k);
    const int lda = tb ? K : N;  // B's row length, its column-major leading dimension
    const int ldb = ta ? M : K;
    for (int64_t b0 = 0; b0 < batch; b0 += INT_MAX) {
        const int cnt = static_cast<int>(std::min<int64_t>(batch - b0, INT_MAX));
        if constexpr (std::is_same<T, double>::value) {
            static_assert(std::is_same<C, double>::value, "float64 GEMMs write float64");
            GemmStridedBatchedF64(h, tb, ta, N, M, K, alpha, b + b0 * stride_b, lda, stride_b, a + b0 * stride_a, ldb,
                                  stride_a, beta, c + b0 * stride_c, N, stride_c, cnt);
        } else {
            static_assert(std::is_same<C, float>::value || std::is_same<C, T>::value, "C is float32 or T");
            GemmStridedBatched(h, tb, ta, N, M, K, static_cast<float>(alpha), b + b0 * stride_b, lda, stride_b,
                               a + b0 * stride_a, ldb, stride_a, BlasTypeOf<T>(), static_cast<float>(beta),
                               c + b0 * stride_c, N, stride_c, BlasTypeOf<C>(), cnt);
        }
    }
}

// out[r, o] = bias[o] for r < rows (linear's bias, before a beta = 1 GEMM).
template <typename T>
__global__ void BiasRowsKernel(const T* __restrict__ bias, T* __restrict__ out, int64_t rows, int64_t cols) {
    GPU_KERNEL_LOOP(i, rows * cols) { out[i] = bias[i % cols]; }
}

// out[r, o] = acc[r, o] + bias[o] in float32, rounded once to T (linear's small 16-bit outputs, from a float32
// product).
template <typename T>
__global__ void AddBiasRoundKernel(const float* __restrict__ acc, const T* __restrict__ bias, T* __restrict__ out,
                                   int64_t rows, int64_t cols) {
    GPU_KERNEL_LOOP(i, rows * cols) { out[i] = FromAcc<T>(acc[i] + ToAcc(bias[i % cols])); }
}

}  // namespace infinitrain::gpu
