// The cuBLASLt fp8_matmul (fp8_gemm.cc): how many calls it ran on cuBLASLt, so a test can tell them from the plain
// kernel it falls back to.
#pragma once

#include <cstdint>

namespace infinitrain::gpu {

uint64_t LtFp8Calls();

}  // namespace infinitrain::gpu
