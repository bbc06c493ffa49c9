// cuBLASLt pieces the cuda provider's GEMM files share: one handle per thread and device, RAII owners for the
// descriptor types, and the operand alignment the heuristic is told about.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <type_traits>

#include "backends/cuda/vendor_cuda.h"

namespace infinitrain::gpu::lt {

inline cublasLtHandle_t Handle(int device) {
    thread_local std::map<int, cublasLtHandle_t> handles;  // kept for the thread's life
    cublasLtHandle_t& h = handles[device];
    if (!h) CheckBlas(cublasLtCreate(&h), "cublasLtCreate");
    return h;
}

// The largest power of two up to 256 that divides the address: cuBLASLt's kernels need aligned operands.
inline uint32_t Alignment(const void* p) {
    auto a = reinterpret_cast<uintptr_t>(p);
    uintptr_t low = a & (~a + 1);
    return a == 0 || low > 256 ? 256 : static_cast<uint32_t>(low);
}

struct DescFree {
    void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutFree {
    void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PrefFree {
    void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using Desc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, DescFree>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutFree>;
using Pref = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PrefFree>;

inline Layout MakeLayout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t l = nullptr;
    CheckBlas(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
    return Layout(l);
}

}  // namespace infinitrain::gpu::lt
