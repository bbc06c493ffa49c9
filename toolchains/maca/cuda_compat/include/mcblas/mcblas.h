// Test fixture (the MACA-on-CUDA compatibility SDK): the mcBLAS names the
// maca provider uses, as their cuBLAS counterparts.
#pragma once

#include <cublas_v2.h>

#include "mcr/mc_runtime.h"

typedef cublasHandle_t mcblasHandle_t;
typedef cublasStatus_t mcblasStatus_t;
typedef cublasOperation_t mcblasOperation_t;
typedef cublasComputeType_t mcblasComputeType_t;
typedef cudaDataType_t macaDataType;

#define MCBLAS_STATUS_SUCCESS CUBLAS_STATUS_SUCCESS
#define MCBLAS_OP_N CUBLAS_OP_N
#define MCBLAS_OP_T CUBLAS_OP_T
#define MCBLAS_COMPUTE_32F CUBLAS_COMPUTE_32F
#define MCBLAS_COMPUTE_64F CUBLAS_COMPUTE_64F
#define MCBLAS_GEMM_DEFAULT CUBLAS_GEMM_DEFAULT
#define MACA_R_16F CUDA_R_16F
#define MACA_R_16BF CUDA_R_16BF
#define MACA_R_32F CUDA_R_32F
#define MACA_R_64F CUDA_R_64F

#define mcblasCreate cublasCreate
#define mcblasDestroy cublasDestroy
#define mcblasSetStream cublasSetStream
#define mcblasGemmEx cublasGemmEx
#define mcblasGemmStridedBatchedEx cublasGemmStridedBatchedEx
#define mcblasDgemmStridedBatched cublasDgemmStridedBatched
#define mcblasGetStatusString cublasGetStatusString
