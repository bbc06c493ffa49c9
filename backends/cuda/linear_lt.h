// The cuBLASLt linear and linear_weight_grad (linear_lt.cc): how many calls they ran, so a test can tell them from
// the portable fallback.
#pragma once

#include <cstdint>

namespace infinitrain::gpu {

uint64_t LtLinearCalls();
uint64_t LtWeightGradCalls();

}  // namespace infinitrain::gpu
