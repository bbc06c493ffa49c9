// The cuBLASLt linear (linear_lt.cc): how many calls it ran, so a test can tell it from the portable fallback.
#pragma once

#include <cstdint>

namespace infinitrain::gpu {

uint64_t LtLinearCalls();

}  // namespace infinitrain::gpu
