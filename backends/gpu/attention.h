// The portable attention kernels (ops_attention.cu), for a provider that
// overrides sdpa with a vendor library and falls back to these where the
// library declines a case.
#pragma once

#include "infinitrain/op.h"

namespace infinitrain::gpu {

void PortableSdpa(KernelContext& ctx);
void PortableSdpaBackward(KernelContext& ctx);
void PortableSdpaBthd(KernelContext& ctx);
void PortableSdpaBthdBackward(KernelContext& ctx);

}  // namespace infinitrain::gpu
