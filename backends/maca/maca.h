// The maca provider's public C++ API: for programs that embed the core
// without Python (the Python module's register_backend() calls this).
#pragma once

namespace infinitrain::maca {

// Claims the PrivateUse1 slot for "maca" (autocast dtype bfloat16); idempotent. Touches no device.
void RegisterBackend();

}  // namespace infinitrain::maca
