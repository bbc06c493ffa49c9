#include "backends/cuda/cuda.h"
#include "infinitrain/provider.h"

namespace infinitrain::cuda {

void RegisterBackend() { RegisterProvider({"cuda", DataType::kBFloat16}); }

}  // namespace infinitrain::cuda
