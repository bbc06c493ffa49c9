// Test fixture (the MACA-on-CUDA compatibility SDK): MACA's bfloat16 type and
// conversions as CUDA's.
#pragma once

#include <cuda_bf16.h>

typedef __nv_bfloat16 __maca_bfloat16;
