// Test fixture (the MACA-on-CUDA compatibility SDK): MACA's float16 type and
// conversions, which carry CUDA's names (__half, __half2float, ...).
#pragma once

#include <cuda_fp16.h>
