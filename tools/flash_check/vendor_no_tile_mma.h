// A stand-in for a vendor header without tensor cores (backends/maca/vendor_maca.h's policy choice): CUDA's
// header with kHasTileMma false and no TileMma, so flash_attention.cuh must compile its SIMT policy alone.
#pragma once

#define kHasTileMma kHasTileMma_hidden_by_flash_check
#define TileMma TileMma_hidden_by_flash_check
#include "backends/cuda/vendor_cuda.h"
#undef kHasTileMma
#undef TileMma

namespace infinitrain::gpu {
inline constexpr bool kHasTileMma = false;
}  // namespace infinitrain::gpu
