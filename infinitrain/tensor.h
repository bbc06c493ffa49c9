// Tensor: a dtype, a shape and a contiguous, row-major window into storage
// owned by a device allocator. Every tensor is contiguous: reshape shares
// storage, and permute/slice/transpose produce copies, so no kernel sees strides.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infinitrain/allocator.h"
#include "infinitrain/device.h"
#include "infinitrain/dtype.h"
#include "infinitrain/stream.h"

namespace infinitrain {

using Shape = std::vector<int64_t>;

class Storage {
public:
    // Allocates from the device's caching allocator for work on the device's current stream
    // (pinned: page-locked host memory, for a cpu device only); `slack` more bytes lie after the storage's own.
    Storage(size_t nbytes, Device device, bool pinned = false, size_t slack = 0);
    // Wraps memory owned elsewhere (NumPy arrays, a provider's host view of device memory); never freed here.
    Storage(void* data, size_t nbytes, Device device) : data_(data), nbytes_(nbytes), device_(device) {}
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() const { return data_; }
    size_t nbytes() const { return nbytes_; }
    const Device& device() const { return device_; }
    bool pinned() const { return pinned_; }
    // Allocated here (not wrapping memory owned elsewhere).
    bool owns_memory() const { return block_ != nullptr; }
    // Work on `stream` uses this memory: when freed, it waits for that work (stream-ordered reuse).
    void RecordStream(const Stream& stream) {
        // Streams compare with their device: a pinned block belongs to the cpu stream, whose null handle is every
        // default stream's too.
        if (block_ && stream != block_->stream) block_->owner->RecordStream(block_, stream);
    }
    // Counts in-place writes (the dispatcher bumps it), so autograd can detect saved tensors that changed.
    uint64_t version() const { return version_; }
    void BumpVersion() { ++version_; }

private:
    void* data_ = nullptr;
    size_t nbytes_ = 0;
    Device device_;
    MemoryBlock* block_ = nullptr;  // null for memory owned elsewhere
    bool pinned_ = false;
    uint64_t version_ = 0;
};

class Tensor {
public:
    Tensor() = default;
    static Tensor Empty(const Shape& shape, DataType dtype, Device device);
    // A cpu tensor in page-locked memory, which copies to and from an accelerator read asynchronously.
    static Tensor EmptyPinned(const Shape& shape, DataType dtype);
    // Empty with `guard` more bytes allocated after the tensor's own (they belong to no tensor): the dispatcher's
    // test mode fills them and checks them after a CPU kernel, to catch writes past the end of an output.
    static Tensor EmptyGuarded(const Shape& shape, DataType dtype, Device device, size_t guard);
    // A tensor over memory the caller keeps alive (contiguous, numel * dtype size bytes).
    static Tensor FromBlob(void* data, const Shape& shape, DataType dtype, Device device);

    bool defined() const { return static_cast<bool>(storage_); }
    const Shape& shape() const { return shape_; }
    int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
    int64_t size(int64_t d) const;  // negative d counts from the end
    int64_t numel() const { return numel_; }
    DataType dtype() const { return dtype_; }
    const Device& device() const { return storage_->device(); }
    size_t nbytes() const { return static_cast<size_t>(numel_) * DataTypeSize(dtype_); }
    const std::shared_ptr<Storage>& storage() const { return storage_; }

    void* data() const { return static_cast<char*>(storage_->data()) + offset_; }
    template <typename T>
    T* data() const {
        return static_cast<T*>(data());
    }

    // Same storage, new shape (one entry may be -1). Raises on a numel mismatch.
    Tensor Reshape(const Shape& shape) const;
    bool is_pinned() const { return storage_->pinned(); }
    // The only handle on memory allocated for it alone: no other tensor (no view) shares the storage, and the
    // tensor spans all of it. Autograd hands such a gradient to a leaf's .grad without a copy.
    bool SoleOwner() const {
        return storage_ && storage_.use_count() == 1 && storage_->owns_memory() && offset_ == 0 &&
               nbytes() == storage_->nbytes();
    }
    // A copy on `device` (the same device too). Copies run on the current stream of the device involved.
    // non_blocking lets the host go on before the copy finished: to a device from pinned memory, and from a
    // device into pinned memory (the result is then pinned; synchronise before reading it). Otherwise a copy
    // to the host has finished on return, and a copy to a device has at least consumed its host source.
    Tensor To(const Device& device, bool non_blocking = false) const;
    // Copies this tensor's bytes into dst (same shape and dtype, any devices), as To does.
    void CopyTo(const Tensor& dst, bool non_blocking = false) const;
    std::string ToString() const;  // "Tensor(float32[2, 3], cpu:0)"

private:
    static Tensor Allocate(const Shape& shape, DataType dtype, Device device, bool pinned, size_t guard = 0);

    std::shared_ptr<Storage> storage_;
    Shape shape_;
    int64_t numel_ = 0;
    size_t offset_ = 0;
    DataType dtype_ = DataType::kFloat32;
};

int64_t Numel(const Shape& shape);
std::string ShapeToString(const Shape& shape);

}  // namespace infinitrain
