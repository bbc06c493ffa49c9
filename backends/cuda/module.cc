// infinitrain_cuda: the cuda provider's Python module. Importing it only loads
// the library (whose runtime, kernels and CCL wait under the name "cuda");
// register_backend() makes them live in the PrivateUse1 slot.
#include <pybind11/pybind11.h>

#include "backends/cuda/cuda.h"
#include "backends/cuda/fp8_gemm.h"
#include "backends/cuda/linear_lt.h"

PYBIND11_MODULE(infinitrain_cuda, m) {
    m.doc() = "infinitrain cuda provider: NVIDIA GPUs through CUDA, cuBLAS, cuDNN and NCCL";
    m.def("register_backend", &infinitrain::cuda::RegisterBackend,
          "Claims the PrivateUse1 slot for 'cuda' (idempotent).");
    m.def("lt_linear_calls", &infinitrain::gpu::LtLinearCalls,
          "How many linear calls ran on cuBLASLt rather than the portable kernel.");
    m.def("lt_weight_grad_calls", &infinitrain::gpu::LtWeightGradCalls,
          "How many linear_weight_grad calls ran on cuBLASLt rather than the portable kernel.");
    m.def("lt_fp8_calls", &infinitrain::gpu::LtFp8Calls,
          "How many fp8_matmul calls ran on cuBLASLt rather than the plain kernel.");
}
