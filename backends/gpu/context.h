// What the kernels take from the op's KernelContext besides tensors and
// attributes: the native stream, the vendor BLAS handle and scratch memory.
// Each has exactly one definition here, so a change in the core's stream or
// handle types touches one line.
#pragma once

#include "backends/gpu/vendor.h"
#include "infinitrain/op.h"
#include "infinitrain/tensor.h"

namespace infinitrain::gpu {

// The op's stream as the vendor's stream type (nullptr: the device's default stream).
inline NativeStream_t NativeStream(const KernelContext& ctx) {
    return static_cast<NativeStream_t>(ctx.stream.handle());
}

// The vendor BLAS handle for ctx.device, bound to the op's stream: the core keeps one per (device, thread)
// through the runtime's BLAS hooks.
inline BlasHandle Blas(const KernelContext& ctx) {
    return static_cast<BlasHandle>(infinitrain::BlasHandle(ctx.stream));
}

// Device scratch for one op, from the core's stream-ordered caching allocator; it returns to the cache when the
// Tensor dies (after the launches that use it are enqueued).
inline Tensor Scratch(const KernelContext& ctx, const Shape& shape, DataType dtype) {
    return Tensor::Empty(shape, dtype, ctx.device);
}

}  // namespace infinitrain::gpu
