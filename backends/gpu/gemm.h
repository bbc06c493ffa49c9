// The portable linear kernels (ops_gemm.cu: linear as bias rows, then a beta = 1 GEMM on the vendor BLAS; its
// parameter gradients as the matmul and sum kernels), for a provider that overrides them with a vendor library and
// falls back to them where the library declines a case.
#pragma once

#include "infinitrain/op.h"

namespace infinitrain::gpu {

void PortableLinear(KernelContext& ctx);
void PortableLinearWeightGrad(KernelContext& ctx);

}  // namespace infinitrain::gpu
