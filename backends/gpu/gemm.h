// The portable linear kernel (ops_gemm.cu: bias rows, then a beta = 1 GEMM on the vendor BLAS), for a provider
// that overrides linear with a vendor library and falls back to it where the library declines a case.
#pragma once

#include "infinitrain/op.h"

namespace infinitrain::gpu {

void PortableLinear(KernelContext& ctx);

}  // namespace infinitrain::gpu
