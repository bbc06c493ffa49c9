// The per-device index-error record (see device_error.h).
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/gpu/device_error.h"

namespace infinitrain::gpu {

// One per device: each device loads its own copy of the module's globals, zero-initialised.
__device__ DeviceErrorRecord g_device_error;

namespace {

std::mutex g_mu;
std::vector<DeviceErrorRecord*> g_slots;  // by device index; null until a kernel asked for it

std::string Message(const DeviceErrorRecord& r) {
    const std::string v = std::to_string(r.value), lim = std::to_string(r.limit);
    const std::string expect = " (expected 0 <= index < " + lim + ")";
    switch (static_cast<IndexErrorKind>(r.kind)) {
        case IndexErrorKind::kEmbedding:
            return "embedding: index " + v + " out of range for a weight with " + lim + " rows" + expect;
        case IndexErrorKind::kEmbeddingBackward:
            return "embedding_backward: index " + v + " out of range for num_weights " + lim + expect;
        case IndexErrorKind::kGather:
        case IndexErrorKind::kScatterAdd:
            return std::string(static_cast<IndexErrorKind>(r.kind) == IndexErrorKind::kGather ? "gather"
                                                                                              : "scatter_add") +
                   ": index " + v + " out of range for dim " + std::to_string(r.extra) + " of size " + lim + expect;
        case IndexErrorKind::kCrossEntropy:
        case IndexErrorKind::kCrossEntropyBackward:
            return std::string(static_cast<IndexErrorKind>(r.kind) == IndexErrorKind::kCrossEntropy
                                   ? "cross_entropy"
                                   : "cross_entropy_backward") +
                   ": target " + v + " at row " + std::to_string(r.position) + " is out of range [0, " + lim +
                   ") (ignore_index " + std::to_string(r.extra) + ")";
        case IndexErrorKind::kMoeTopkBackward:
        case IndexErrorKind::kMoePermute:
            return std::string(static_cast<IndexErrorKind>(r.kind) == IndexErrorKind::kMoePermute
                                   ? "moe_permute"
                                   : "moe_topk_backward") +
                   ": expert " + v + " at slot " + std::to_string(r.position) +
                   " out of range (expected 0 <= expert < " + lim + ")";
        case IndexErrorKind::kMoeUnpermute:
        case IndexErrorKind::kMoeUnpermuteBackward:
            return std::string(static_cast<IndexErrorKind>(r.kind) == IndexErrorKind::kMoeUnpermute
                                   ? "moe_unpermute"
                                   : "moe_unpermute_backward") +
                   ": source must be a permutation of [0, " + lim + "), got " + v + " at row " +
                   std::to_string(r.position);
        default:
            return "a GPU kernel recorded an unknown index error (kind " + std::to_string(r.kind) + ")";
    }
}

}  // namespace

DeviceErrorRecord* DeviceErrorSlot(const KernelContext& ctx) {
    const size_t d = static_cast<size_t>(ctx.device.index);
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_slots.size() <= d) g_slots.resize(d + 1, nullptr);
    if (!g_slots[d]) g_slots[d] = static_cast<DeviceErrorRecord*>(SymbolAddress(g_device_error));
    return g_slots[d];
}

void RaisePendingDeviceError(int device) {
    DeviceErrorRecord* slot = nullptr;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        if (device >= 0 && static_cast<size_t>(device) < g_slots.size()) slot = g_slots[device];
    }
    if (!slot) return;  // no kernel that checks indices has run on this device
    DeviceErrorRecord rec;
    MemcpyToHost(&rec, slot, sizeof rec);
    if (!rec.flag) return;
    const DeviceErrorRecord clear{};
    MemcpyToDevice(slot, &clear, sizeof clear);
    const IndexErrorKind kind = static_cast<IndexErrorKind>(rec.kind);
    if (kind == IndexErrorKind::kMoeUnpermute || kind == IndexErrorKind::kMoeUnpermuteBackward) {
        throw std::invalid_argument(Message(rec));  // as the CPU's InversePermutation
    }
    throw std::out_of_range(Message(rec));
}

}  // namespace infinitrain::gpu
