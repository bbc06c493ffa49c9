#include "backends/maca/maca.h"
#include "infinitrain/provider.h"

namespace infinitrain::maca {

void RegisterBackend() { RegisterProvider({"maca", DataType::kBFloat16}); }

}  // namespace infinitrain::maca
