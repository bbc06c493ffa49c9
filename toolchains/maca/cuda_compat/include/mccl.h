// Test fixture (the MACA-on-CUDA compatibility SDK): MCCL's names as NCCL's,
// which MCCL mirrors.
#pragma once

#include <nccl.h>

#include "mcr/mc_runtime.h"

typedef ncclComm_t mcclComm_t;
typedef ncclUniqueId mcclUniqueId;
typedef ncclResult_t mcclResult_t;
typedef ncclDataType_t mcclDataType_t;
typedef ncclRedOp_t mcclRedOp_t;

#define mcclSuccess ncclSuccess
#define mcclInt8 ncclInt8
#define mcclUint8 ncclUint8
#define mcclInt32 ncclInt32
#define mcclInt64 ncclInt64
#define mcclFloat16 ncclFloat16
#define mcclBfloat16 ncclBfloat16
#define mcclFloat32 ncclFloat32
#define mcclFloat64 ncclFloat64
#define mcclSum ncclSum
#define mcclProd ncclProd
#define mcclMax ncclMax
#define mcclMin ncclMin
#define mcclAvg ncclAvg

#define mcclGetUniqueId ncclGetUniqueId
#define mcclCommInitRank ncclCommInitRank
#define mcclCommInitAll ncclCommInitAll
#define mcclCommDestroy ncclCommDestroy
#define mcclCommGetAsyncError ncclCommGetAsyncError
#define mcclGetErrorString ncclGetErrorString
#define mcclAllReduce ncclAllReduce
#define mcclBroadcast ncclBroadcast
#define mcclReduce ncclReduce
#define mcclAllGather ncclAllGather
#define mcclReduceScatter ncclReduceScatter
#define mcclSend ncclSend
#define mcclRecv ncclRecv
#define mcclGroupStart ncclGroupStart
#define mcclGroupEnd ncclGroupEnd
