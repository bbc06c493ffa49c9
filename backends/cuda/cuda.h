// The cuda provider's public C++ API: for programs that embed the core
// without Python (the Python module's register_backend() calls this).
#pragma once

namespace infinitrain::cuda {

// Claims the PrivateUse1 slot for "cuda" (autocast dtype bfloat16); idempotent. Touches no GPU.
void RegisterBackend();

}  // namespace infinitrain::cuda
