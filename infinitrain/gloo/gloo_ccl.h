// What the cpu's Gloo CCL offers besides the CclBackend it registers.
#pragma once

namespace infinitrain::gloo_ccl {

// Waits until the receivers took every pending send of this process's Gloo communicators (a send completes
// when its receiver takes it). infinitrain.distributed calls it at exit, so a rank that sends last and
// exits does not cut its messages off.
void FlushSends();

}  // namespace infinitrain::gloo_ccl
