// Index errors found by kernels, reported at the next synchronisation.
//
// The CPU kernels check indices (embedding, embedding_backward, gather,
// scatter_add, cross-entropy targets, MoE experts) on the host before anything
// runs and raise std::out_of_range (std::invalid_argument for a MoE source
// that is not a permutation). A GPU kernel cannot do that without a host
// round trip, so the first faulting thread of a device records what it saw
// in a per-device record (a __device__ variable), the kernel skips the bad
// element (no out-of-bounds access; its outputs become NaN where the CPU would
// have raised), and the runtime calls RaisePendingDeviceError after each
// synchronisation, which raises the CPU's exact message.
#pragma once

#include <cstdint>

#include "backends/gpu/vendor.h"
#include "infinitrain/op.h"

namespace infinitrain::gpu {

enum class IndexErrorKind : int32_t {
    kNone = 0,
    kEmbedding,          // value: index, limit: rows
    kEmbeddingBackward,  // value: index, limit: num_weights
    kGather,             // value: index, limit: size of dim `extra`
    kScatterAdd,         // value: index, limit: size of dim `extra`
    kCrossEntropy,       // value: target, position: row, limit: vocabulary, extra: ignore_index
    kCrossEntropyBackward,
    kMoeTopkBackward,       // value: expert, position: slot, limit: num_experts
    kMoePermute,            // value: expert, position: slot, limit: num_experts
    kMoeUnpermute,          // value: source, position: row, limit: N*k (raises std::invalid_argument)
    kMoeUnpermuteBackward,  // value: source, position: row, limit: N*k (raises std::invalid_argument)
};

struct DeviceErrorRecord {
    uint32_t flag;  // 0 until the first fault; the thread that sets it to 1 fills the rest
    int32_t kind;
    long long value, position, limit, extra;
};

#ifdef __CUDACC__
// Records the first index error of the device; later ones are dropped.
__device__ inline void RecordIndexError(DeviceErrorRecord* rec, IndexErrorKind kind, long long value,
                                        long long position, long long limit, long long extra) {
    if (atomicCAS(&rec->flag, 0u, 1u) == 0u) {
        rec->kind = static_cast<int32_t>(kind);
        rec->value = value;
        rec->position = position;
        rec->limit = limit;
        rec->extra = extra;
    }
}
#endif

// The record of ctx.device (the current device), for kernels to write.
DeviceErrorRecord* DeviceErrorSlot(const KernelContext& ctx);

// Raises std::out_of_range (std::invalid_argument for the moe_unpermute kinds) with the CPU kernel's message when a
// kernel on `device` recorded an index error, and clears the record. Synchronous: the runtime calls it after
// synchronising the device, a stream or an event, with `device` current. A no-op when no kernel of this library ran on
// the device.
void RaisePendingDeviceError(int device);

}  // namespace infinitrain::gpu
