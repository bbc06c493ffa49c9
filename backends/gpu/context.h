// What the kernels take from the op's KernelContext besides tensors and
// attributes: the native stream, the vendor BLAS handle and scratch memory.
// Each has exactly one definition here, so a change in the core's stream or
// handle types touches one line.
#pragma once

#include <vector>

#include "backends/gpu/vendor.h"
#include "infinitrain/op.h"
#include "infinitrain/tensor.h"

namespace infinitrain::gpu {

// The op's stream as the vendor's stream type (nullptr: the device's default stream).
inline NativeStream_t NativeStream(const KernelContext& ctx) { return static_cast<NativeStream_t>(ctx.stream); }

// The vendor BLAS handle for ctx.device, bound to the op's stream. One handle per (thread, device), created on
// first use and kept for the life of the thread (destroying it at exit could outlive the driver). The core sets
// the current device to ctx.device before the kernel runs. To be replaced by the core's handle hook.
inline BlasHandle Blas(const KernelContext& ctx) {
    thread_local std::vector<BlasHandle> handles;
    const size_t d = static_cast<size_t>(ctx.device.index);
    if (handles.size() <= d) handles.resize(d + 1, nullptr);
    if (!handles[d]) handles[d] = CreateBlasHandle();
    BlasSetStream(handles[d], NativeStream(ctx));
    return handles[d];
}

// Device scratch for one op, from the core's stream-ordered caching allocator; it returns to the cache when the
// Tensor dies (after the launches that use it are enqueued).
inline Tensor Scratch(const KernelContext& ctx, const Shape& shape, DataType dtype) {
    return Tensor::Empty(shape, dtype, ctx.device);
}

}  // namespace infinitrain::gpu
