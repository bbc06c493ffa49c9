// The MACA vendor header of the provider-neutral GPU code (backends/gpu):
// MetaX's runtime (mc*), mcBLAS, MCCL and __maca_bfloat16 behind the names
// backends/gpu/README.md lists. backends/gpu/vendor.h includes it through
// INFINITRAIN_GPU_VENDOR_HEADER. MACA hardware warps are 64 lanes and lane
// masks 64-bit; the kernels use logical 32-lane groups and never depend on it.
#pragma once

#include <common/maca_bfloat16.h>
#include <common/maca_fp16.h>
#include <mcblas/mcblas.h>
#include <mccl.h>
#include <mcr/mc_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace infinitrain::gpu {

// The provider the kernels register under.
inline constexpr const char* kProviderName = "maca";

// ---- runtime ----------------------------------------------------------------

// The vendor's runtime, BLAS and CCL names by their common stem: GPU_RT(Malloc) is mcMalloc, GPU_BLAS(Create)
// mcblasCreate, GPU_CCL(AllReduce) mcclAllReduce. backends/gpu/runtime.cc and ccl.cc are written with them.
#define GPU_RT(name) mc##name
#define GPU_BLAS(name) mcblas##name
#define GPU_CCL(name) mccl##name

using NativeStream_t = mcStream_t;
using NativeEvent_t = mcEvent_t;
using RtError = mcError_t;
using RtMemcpyKind = mcMemcpyKind;
using RtMemPool = mcMemPool_t;
using CclResult = mcclResult_t;
using CclDataType = mcclDataType_t;
using CclRedOp = mcclRedOp_t;
using CclComm = mcclComm_t;
using CclId = mcclUniqueId;

// The variable that makes every launch wait (CheckLaunch), named in asynchronous errors.
inline constexpr const char* kSyncEnv = "INFINITRAIN_MACA_SYNC";
// MACA users report very large all-reduces losing bandwidth on C550: they are cut into 160 MiB segments
// (INFINITRAIN_CCL_SEGMENT_MB overrides; 0 disables).
inline constexpr int64_t kAllReduceSegmentBytes = int64_t{160} << 20;

inline void CheckVendor(mcError_t e, const char* what) {
    if (e != mcSuccess) throw std::runtime_error(std::string(what) + ": " + mcGetErrorString(e));
}

// Raises when the last kernel launch on this thread failed (bad configuration, no kernel image for the device).
// INFINITRAIN_MACA_SYNC=1 waits for every kernel as it is launched, so a fault names its op (slow: for debugging).
inline bool SyncEveryLaunch() {
    static const bool on = [] {
        const char* e = std::getenv(kSyncEnv);
        return e && std::strcmp(e, "1") == 0;
    }();
    return on;
}

inline void CheckLaunch(const char* op) {
    mcError_t e = mcGetLastError();
    if (e != mcSuccess) {
        throw std::runtime_error(std::string(op) + ": MACA kernel launch failed: " + mcGetErrorString(e));
    }
    if (SyncEveryLaunch() && (e = mcDeviceSynchronize()) != mcSuccess) {
        throw std::runtime_error(std::string(op) + ": MACA kernel failed: " + mcGetErrorString(e));
    }
}

inline void MemsetAsync(void* p, int value, size_t nbytes, NativeStream_t s) {
    if (nbytes) CheckVendor(mcMemsetAsync(p, value, nbytes, s), "mcMemsetAsync");
}

inline void MemcpyDeviceAsync(void* dst, const void* src, size_t nbytes, NativeStream_t s) {
    if (nbytes) CheckVendor(mcMemcpyAsync(dst, src, nbytes, mcMemcpyDeviceToDevice, s), "mcMemcpyAsync");
}

// Device address of a __device__ variable of this module on the current device.
template <typename T>
void* SymbolAddress(const T& symbol) {
    void* p = nullptr;
    CheckVendor(mcGetSymbolAddress(&p, symbol), "mcGetSymbolAddress");
    return p;
}

// Synchronous copies for the rare host reads of device state (the device-error record).
inline void MemcpyToHost(void* dst, const void* src, size_t nbytes) {
    CheckVendor(mcMemcpy(dst, src, nbytes, mcMemcpyDeviceToHost), "mcMemcpy");
}
inline void MemcpyToDevice(void* dst, const void* src, size_t nbytes) {
    CheckVendor(mcMemcpy(dst, src, nbytes, mcMemcpyHostToDevice), "mcMemcpy");
}

// ---- 16-bit floats: device types and float conversions (round to nearest even) ----

using bf16_t = __maca_bfloat16;
using fp16_t = __half;

__device__ __forceinline__ float ToFloat(bf16_t v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(fp16_t v) { return __half2float(v); }
__device__ __forceinline__ bf16_t FloatToBF16(float f) { return __float2bfloat16_rn(f); }
__device__ __forceinline__ fp16_t FloatToFP16(float f) { return __float2half_rn(f); }

// ---- warps ------------------------------------------------------------------

// Physical warp width. Kernels use logical 32-lane groups (shuffles with width 32), so they never depend on it.
inline constexpr int kWarpSize = 64;
// What __ballot_sync returns and the *_sync intrinsics take: one bit per lane of a 64-lane warp.
using LaneMask = unsigned long long;
inline constexpr LaneMask kFullLaneMask = ~LaneMask{0};

// ---- tensor cores -------------------------------------------------------------

// No TileMma: the fragment layout of MetaX's MMA builtins is not verified without hardware, so
// flash_attention.cuh runs its SIMT policy here.
inline constexpr bool kHasTileMma = false;

// ---- BLAS -------------------------------------------------------------------

using BlasHandle = mcblasHandle_t;

// Storage types of GEMM operands.
enum class BlasType { kFloat32, kBFloat16, kFloat16 };

inline void CheckBlas(mcblasStatus_t s, const char* what) {
    if (s != MCBLAS_STATUS_SUCCESS)
        throw std::runtime_error(std::string(what) + " failed: status " + std::to_string(s));
}

inline void ConfigureBlasHandle(BlasHandle) {}

// INFINITRAIN_MACA_FP64_GEMM=1 accumulates float32 GEMMs in float64 (MACA users report it for precision parity
// with CUDA in the linear layers' backward); off by default: it is several times slower.
inline bool Fp64Accumulate() {
    static const bool on = [] {
        const char* e = std::getenv("INFINITRAIN_MACA_FP64_GEMM");
        return e && std::strcmp(e, "1") == 0;
    }();
    return on;
}

inline macaDataType ToMaca(BlasType t) {
    switch (t) {
        case BlasType::kBFloat16:
            return MACA_R_16BF;
        case BlasType::kFloat16:
            return MACA_R_16F;
        default:
            return MACA_R_32F;
    }
}

// Column-major, strided batched: C_i = alpha * op(A_i) @ op(B_i) + beta * C_i for i < batch, accumulated in
// float32 (float64 for float32 operands under INFINITRAIN_MACA_FP64_GEMM). A and B share the storage type
// `ab`; C is `c` (ab itself, or float32).
inline void GemmStridedBatched(BlasHandle h, bool ta, bool tb, int m, int n, int k, float alpha, const void* a, int lda,
                               long long stride_a, const void* b, int ldb, long long stride_b, BlasType ab, float beta,
                               void* c, int ldc, long long stride_c, BlasType ct, int batch) {
    mcblasComputeType_t compute = ab == BlasType::kFloat32 && ct == BlasType::kFloat32 && Fp64Accumulate()
                                      ? MCBLAS_COMPUTE_64F
                                      : MCBLAS_COMPUTE_32F;
    if (compute == MCBLAS_COMPUTE_64F) {
        // A float64 compute type takes float64 scalars.
        double alpha64 = alpha, beta64 = beta;
        CheckBlas(
            mcblasGemmStridedBatchedEx(h, ta ? MCBLAS_OP_T : MCBLAS_OP_N, tb ? MCBLAS_OP_T : MCBLAS_OP_N, m, n, k,
                                       &alpha64, a, MACA_R_32F, lda, stride_a, b, MACA_R_32F, ldb, stride_b, &beta64, c,
                                       MACA_R_32F, ldc, stride_c, batch, compute, MCBLAS_GEMM_DEFAULT),
            "mcblasGemmStridedBatchedEx");
        return;
    }
    CheckBlas(mcblasGemmStridedBatchedEx(h, ta ? MCBLAS_OP_T : MCBLAS_OP_N, tb ? MCBLAS_OP_T : MCBLAS_OP_N, m, n, k,
                                         &alpha, a, ToMaca(ab), lda, stride_a, b, ToMaca(ab), ldb, stride_b, &beta, c,
                                         ToMaca(ct), ldc, stride_c, batch, compute, MCBLAS_GEMM_DEFAULT),
              "mcblasGemmStridedBatchedEx");
}

// The same in float64.
inline void GemmStridedBatchedF64(BlasHandle h, bool ta, bool tb, int m, int n, int k, double alpha, const double* a,
                                  int lda, long long stride_a, const double* b, int ldb, long long stride_b,
                                  double beta, double* c, int ldc, long long stride_c, int batch) {
    CheckBlas(mcblasDgemmStridedBatched(h, ta ? MCBLAS_OP_T : MCBLAS_OP_N, tb ? MCBLAS_OP_T : MCBLAS_OP_N, m, n, k,
                                        &alpha, a, lda, stride_a, b, ldb, stride_b, &beta, c, ldc, stride_c, batch),
              "mcblasDgemmStridedBatched");
}

}  // namespace infinitrain::gpu
