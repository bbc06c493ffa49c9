// Internal interface of the cuda provider, shared by its runtime, CCL and the
// kernels' context. Nothing outside backends/cuda includes this.
#pragma once

#include <cuda_runtime.h>

namespace infinitrain::gpu {
// Raises an index error a kernel recorded on `device` (backends/gpu/device_error.h).
void RaisePendingDeviceError(int device);
}  // namespace infinitrain::gpu

namespace infinitrain::cuda {

constexpr const char* kName = "cuda";

// Raises std::runtime_error naming `what` when e is not cudaSuccess.
void Check(cudaError_t e, const char* what);

}  // namespace infinitrain::cuda
