// The one door to the vendor: includes the header named by the macro
// INFINITRAIN_GPU_VENDOR_HEADER, which the provider's build defines (cuda:
// "backends/cuda/vendor_cuda.h"). README.md lists what that header provides.
#pragma once

#ifndef INFINITRAIN_GPU_VENDOR_HEADER
#error "define INFINITRAIN_GPU_VENDOR_HEADER to the provider's vendor header, e.g. \"backends/cuda/vendor_cuda.h\""
#endif

#include INFINITRAIN_GPU_VENDOR_HEADER

#include <type_traits>

namespace infinitrain::gpu {

static_assert(kWarpSize == 32 || kWarpSize == 64, "kWarpSize: the physical warp width, 32 or 64");
static_assert(std::is_unsigned<LaneMask>::value && sizeof(LaneMask) * 8 >= kWarpSize,
              "LaneMask: the unsigned type __ballot_sync returns, one bit per lane");
static_assert(kFullLaneMask == static_cast<LaneMask>(~LaneMask{0}), "kFullLaneMask: every bit of LaneMask set");
static_assert(sizeof(bf16_t) == 2 && sizeof(fp16_t) == 2, "bf16_t and fp16_t are the 2-byte device float types");

}  // namespace infinitrain::gpu
