// The CUDA vendor header of the provider-neutral GPU kernels (backends/gpu).
// backends/gpu/vendor.h includes it through INFINITRAIN_GPU_VENDOR_HEADER; the
// kernels reach CUDA, cuBLAS and the CUDA math types only through the names
// defined here. backends/gpu/README.md lists the contract every vendor header
// fulfils (a MACA one maps the same names to mc*/mcblas* and __maca_bfloat16).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace infinitrain::gpu {

// The provider the kernels register under.
inline constexpr const char* kProviderName = "cuda";

// ---- runtime ----------------------------------------------------------------

// The vendor's runtime, BLAS and CCL names by their common stem: GPU_RT(Malloc) is cudaMalloc, GPU_BLAS(Create)
// cublasCreate, GPU_CCL(AllReduce) ncclAllReduce. backends/gpu/runtime.cc and ccl.cc are written with them.
#define GPU_RT(name) cuda##name
#define GPU_BLAS(name) cublas##name
#define GPU_CCL(name) nccl##name

using NativeStream_t = cudaStream_t;
using NativeEvent_t = cudaEvent_t;
using RtError = cudaError_t;
using RtMemcpyKind = cudaMemcpyKind;
using RtMemPool = cudaMemPool_t;
using CclResult = ncclResult_t;
using CclDataType = ncclDataType_t;
using CclRedOp = ncclRedOp_t;
using CclComm = ncclComm_t;
using CclId = ncclUniqueId;

// The variable that makes every launch wait (CheckLaunch), named in asynchronous errors.
inline constexpr const char* kSyncEnv = "INFINITRAIN_CUDA_SYNC";
// All-reduces are not cut into segments unless INFINITRAIN_CCL_SEGMENT_MB says so.
inline constexpr int64_t kAllReduceSegmentBytes = 0;

inline void CheckVendor(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Raises when the last kernel launch on this thread failed (bad configuration, no kernel image for the device).
// INFINITRAIN_CUDA_SYNC=1 waits for every kernel as it is launched, so a fault names its op (slow: for debugging).
inline bool SyncEveryLaunch() {
    static const bool on = [] {
        const char* e = std::getenv("INFINITRAIN_CUDA_SYNC");
        return e && std::strcmp(e, "1") == 0;
    }();
    return on;
}

inline void CheckLaunch(const char* op) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        throw std::runtime_error(std::string(op) + ": CUDA kernel launch failed: " + cudaGetErrorString(e));
    }
    if (SyncEveryLaunch() && (e = cudaDeviceSynchronize()) != cudaSuccess) {
        throw std::runtime_error(std::string(op) + ": CUDA kernel failed: " + cudaGetErrorString(e));
    }
}

inline void MemsetAsync(void* p, int value, size_t nbytes, NativeStream_t s) {
    if (nbytes) CheckVendor(cudaMemsetAsync(p, value, nbytes, s), "cudaMemsetAsync");
}

inline void MemcpyDeviceAsync(void* dst, const void* src, size_t nbytes, NativeStream_t s) {
    if (nbytes) CheckVendor(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
}

// Device address of a __device__ variable of this module on the current device.
template <typename T>
void* SymbolAddress(const T& symbol) {
    void* p = nullptr;
    CheckVendor(cudaGetSymbolAddress(&p, symbol), "cudaGetSymbolAddress");
    return p;
}

// Synchronous copies for the rare host reads of device state (the device-error record).
inline void MemcpyToHost(void* dst, const void* src, size_t nbytes) {
    CheckVendor(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}
inline void MemcpyToDevice(void* dst, const void* src, size_t nbytes) {
    CheckVendor(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

// ---- 16-bit floats: device types and float conversions (round to nearest even) ----

using bf16_t = __nv_bfloat16;
using fp16_t = __half;

__device__ __forceinline__ float ToFloat(bf16_t v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(fp16_t v) { return __half2float(v); }
__device__ __forceinline__ bf16_t FloatToBF16(float f) { return __float2bfloat16_rn(f); }
__device__ __forceinline__ fp16_t FloatToFP16(float f) { return __float2half_rn(f); }

// ---- warps ------------------------------------------------------------------

// Physical warp width. Kernels use logical 32-lane groups (shuffles with width 32), so they never depend on it.
inline constexpr int kWarpSize = 32;
// What __ballot_sync returns and the *_sync intrinsics take.
using LaneMask = unsigned int;
inline constexpr LaneMask kFullLaneMask = ~LaneMask{0};

// ---- BLAS -------------------------------------------------------------------

using BlasHandle = cublasHandle_t;

// Storage types of GEMM operands.
enum class BlasType { kFloat32, kBFloat16, kFloat16 };

inline void CheckBlas(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        throw std::runtime_error(std::string(what) + " failed: " + cublasGetStatusString(s));
    }
}

// Split-K partial sums stay in float32 even for bfloat16/float16 outputs (rounded once, as on the cpu).
inline void ConfigureBlasHandle(BlasHandle h) {
    CheckBlas(cublasSetMathMode(
                  h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
              "cublasSetMathMode");
}

// TF32 tensor cores for float32 GEMMs only when INFINITRAIN_CUDA_TF32=1: they round inputs to 10 mantissa bits,
// which the float32 tolerances of the op tests do not allow, so exact float32 is the default.
inline bool Tf32Enabled() {
    static const bool on = [] {
        const char* e = std::getenv("INFINITRAIN_CUDA_TF32");
        return e && std::strcmp(e, "1") == 0;
    }();
    return on;
}

inline cudaDataType_t ToCuda(BlasType t) {
    switch (t) {
        case BlasType::kBFloat16:
            return CUDA_R_16BF;
        case BlasType::kFloat16:
            return CUDA_R_16F;
        default:
            return CUDA_R_32F;
    }
}

// Column-major, strided batched: C_i = alpha * op(A_i) @ op(B_i) + beta * C_i for i < batch, accumulated in
// float32. A and B share the storage type `ab`; C is `c` (ab itself, or float32).
inline void GemmStridedBatched(BlasHandle h, bool ta, bool tb, int m, int n, int k, float alpha, const void* a, int lda,
                               long long stride_a, const void* b, int ldb, long long stride_b, BlasType ab, float beta,
                               void* c, int ldc, long long stride_c, BlasType ct, int batch) {
    cublasComputeType_t compute =
        ab == BlasType::kFloat32 && Tf32Enabled() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CheckBlas(cublasGemmStridedBatchedEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                         &alpha, a, ToCuda(ab), lda, stride_a, b, ToCuda(ab), ldb, stride_b, &beta, c,
                                         ToCuda(ct), ldc, stride_c, batch, compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
}

// The same in float64.
inline void GemmStridedBatchedF64(BlasHandle h, bool ta, bool tb, int m, int n, int k, double alpha, const double* a,
                                  int lda, long long stride_a, const double* b, int ldb, long long stride_b,
                                  double beta, double* c, int ldc, long long stride_c, int batch) {
    CheckBlas(cublasDgemmStridedBatched(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                        &alpha, a, lda, stride_a, b, ldb, stride_b, &beta, c, ldc, stride_c, batch),
              "cublasDgemmStridedBatched");
}

}  // namespace infinitrain::gpu
