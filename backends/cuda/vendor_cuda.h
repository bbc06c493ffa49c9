// The CUDA vendor header of the provider-neutral GPU kernels (backends/gpu).
// backends/gpu/vendor.h includes it through INFINITRAIN_GPU_VENDOR_HEADER; the
// kernels reach CUDA, cuBLAS and the CUDA math types only through the names
// defined here. backends/gpu/README.md lists the contract every vendor header
// fulfils (a MACA one maps the same names to mc*/mcblas* and __maca_bfloat16).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "infinitrain/op.h"

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

// ---- float8 (optional): two float32s to two float8 codes, rounded to nearest even and saturated to the largest
// finite value; a NaN's code is the caller's to fix (backends/gpu/ops_fp8.cu). One cvt.rn.satfinite instruction
// on compute capability 8.9 and later.
#define INFINITRAIN_GPU_FP8_CONVERT 1
__device__ __forceinline__ uint32_t Fp8x2Saturate(float lo, float hi, bool e5m2) {
    return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// ---- warps ------------------------------------------------------------------

// Physical warp width. Kernels use logical 32-lane groups (shuffles with width 32), so they never depend on it.
inline constexpr int kWarpSize = 32;
// What __ballot_sync returns and the *_sync intrinsics take.
using LaneMask = unsigned int;
inline constexpr LaneMask kFullLaneMask = ~LaneMask{0};

// ---- tensor cores (backends/gpu/flash_attention.cuh) --------------------------

inline constexpr bool kHasTileMma = true;

// One 32-lane warp: C[16x16] (float) += A[16x16] * B[16x16] (bf16_t or fp16_t), as two
// mma.sync.aligned.m16n8k16.row.col, in the fragment layout PTX defines for that shape (sm_80 and later):
// B's columns 0-7 and 8-15 are the two n8 halves. Element i of a lane's fragment holds the matrix element the index
// functions name: A (row, k), B (k, col), C (row, col); g = lane / 4 is PTX's groupID, t = lane % 4 its
// threadID_in_group. Elements 2j and 2j + 1 share one 32-bit register (2j in the low half).
struct TileMma {
    static constexpr int kElems = 8;  // per lane, in each of A, B and C
    __host__ __device__ static constexpr int ARow(int lane, int i) { return lane / 4 + 8 * (i / 2 % 2); }
    __host__ __device__ static constexpr int ACol(int lane, int i) { return lane % 4 * 2 + i % 2 + 8 * (i / 4); }
    __host__ __device__ static constexpr int BRow(int lane, int i) { return lane % 4 * 2 + i % 2 + 8 * (i / 2 % 2); }
    __host__ __device__ static constexpr int BCol(int lane, int i) { return lane / 4 + 8 * (i / 4); }
    __host__ __device__ static constexpr int CRow(int lane, int i) { return lane / 4 + 8 * (i / 2 % 2); }
    __host__ __device__ static constexpr int CCol(int lane, int i) { return lane % 4 * 2 + i % 2 + 8 * (i / 4); }

    __device__ static void Run(float (&c)[kElems], const bf16_t (&a)[kElems], const bf16_t (&b)[kElems]) {
        uint32_t ra[4], rb[4];
        for (int j = 0; j < 4; ++j) {
            ra[j] = Pack(__bfloat16_as_ushort(a[2 * j]), __bfloat16_as_ushort(a[2 * j + 1]));
            rb[j] = Pack(__bfloat16_as_ushort(b[2 * j]), __bfloat16_as_ushort(b[2 * j + 1]));
        }
        for (int h = 0; h < 2; ++h) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                "{%0,%1,%2,%3};\n"
                : "+f"(c[4 * h]), "+f"(c[4 * h + 1]), "+f"(c[4 * h + 2]), "+f"(c[4 * h + 3])
                : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[2 * h]), "r"(rb[2 * h + 1]));
        }
    }

    __device__ static void Run(float (&c)[kElems], const fp16_t (&a)[kElems], const fp16_t (&b)[kElems]) {
        uint32_t ra[4], rb[4];
        for (int j = 0; j < 4; ++j) {
            ra[j] = Pack(__half_as_ushort(a[2 * j]), __half_as_ushort(a[2 * j + 1]));
            rb[j] = Pack(__half_as_ushort(b[2 * j]), __half_as_ushort(b[2 * j + 1]));
        }
        for (int h = 0; h < 2; ++h) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                "{%0,%1,%2,%3};\n"
                : "+f"(c[4 * h]), "+f"(c[4 * h + 1]), "+f"(c[4 * h + 2]), "+f"(c[4 * h + 3])
                : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[2 * h]), "r"(rb[2 * h + 1]));
        }
    }

private:
    __device__ static uint32_t Pack(unsigned short lo, unsigned short hi) {
        return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
};

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

// A two-way switch of a vendor-library override: false when `name` is unset, empty or `off` (the default), true
// when it is `on`; any other value is an error naming the variable. Callers read it once per process.
inline bool EnvSwitch(const char* name, const char* off, const char* on) {
    const char* e = std::getenv(name);
    if (!e || !*e || std::strcmp(e, off) == 0) return false;
    if (std::strcmp(e, on) == 0) return true;
    throw std::invalid_argument(std::string(name) + "='" + e + "': expected '" + off + "' (the default) or '" + on +
                                "'");
}

// TF32 tensor cores for float32 GEMMs when the core's float32 matmul precision is below "highest" (PyTorch's
// allow_tf32 / set_float32_matmul_precision) or INFINITRAIN_CUDA_TF32=1: they round inputs to 10 mantissa bits,
// which the float32 tolerances of the op tests do not allow, so exact float32 is the default.
inline bool Tf32Enabled() {
    static const bool env = [] {
        const char* e = std::getenv("INFINITRAIN_CUDA_TF32");
        return e && std::strcmp(e, "1") == 0;
    }();
    return env || Float32MatmulPrecision() != MatmulPrecision::kHighest;
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
