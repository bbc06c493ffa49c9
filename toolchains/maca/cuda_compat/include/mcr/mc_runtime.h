// Test fixture (the MACA-on-CUDA compatibility SDK, ../../README.md): the
// MACA runtime names the maca provider uses, as their CUDA counterparts.
#pragma once

#include <cuda_runtime.h>

typedef cudaError_t mcError_t;
typedef cudaStream_t mcStream_t;
typedef cudaEvent_t mcEvent_t;
typedef cudaMemPool_t mcMemPool_t;
typedef cudaMemcpyKind mcMemcpyKind;

#define mcSuccess cudaSuccess
#define mcErrorMemoryAllocation cudaErrorMemoryAllocation
#define mcErrorNotReady cudaErrorNotReady
#define mcStreamNonBlocking cudaStreamNonBlocking
#define mcEventDefault cudaEventDefault
#define mcEventDisableTiming cudaEventDisableTiming
#define mcMemcpyHostToDevice cudaMemcpyHostToDevice
#define mcMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define mcMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define mcMemPoolAttrReleaseThreshold cudaMemPoolAttrReleaseThreshold

inline mcError_t mcInit(unsigned int) { return cudaFree(nullptr); }  // creates the context, as mcInit does
#define mcGetDeviceCount cudaGetDeviceCount
#define mcGetDevice cudaGetDevice
#define mcSetDevice cudaSetDevice
#define mcDeviceSynchronize cudaDeviceSynchronize
#define mcDeviceGetStreamPriorityRange cudaDeviceGetStreamPriorityRange
#define mcStreamCreateWithFlags cudaStreamCreateWithFlags
#define mcStreamCreateWithPriority cudaStreamCreateWithPriority
#define mcStreamSynchronize cudaStreamSynchronize
#define mcStreamWaitEvent cudaStreamWaitEvent
#define mcEventCreateWithFlags cudaEventCreateWithFlags
#define mcEventDestroy cudaEventDestroy
#define mcEventRecord cudaEventRecord
#define mcEventQuery cudaEventQuery
#define mcEventSynchronize cudaEventSynchronize
#define mcEventElapsedTime cudaEventElapsedTime
#define mcMalloc cudaMalloc
#define mcFree cudaFree
#define mcMallocAsync cudaMallocAsync
#define mcFreeAsync cudaFreeAsync
#define mcMallocHost cudaMallocHost
#define mcFreeHost cudaFreeHost
#define mcMemcpy cudaMemcpy
#define mcMemcpyAsync cudaMemcpyAsync
#define mcMemsetAsync cudaMemsetAsync
#define mcMemGetInfo cudaMemGetInfo
#define mcDeviceGetDefaultMemPool cudaDeviceGetDefaultMemPool
#define mcMemPoolSetAttribute cudaMemPoolSetAttribute
#define mcGetSymbolAddress cudaGetSymbolAddress
#define mcGetLastError cudaGetLastError
#define mcGetErrorString cudaGetErrorString
