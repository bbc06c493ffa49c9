// Tensor: a dtype, a shape and a contiguous, row-major window into storage
// owned by a device allocator. Every tensor is contiguous: reshape shares
// storage, and permute/slice/transpose produce copies, so no kernel sees strides.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infinitrain/device.h"
#include "infinitrain/dtype.h"

namespace infinitrain {

using Shape = std::vector<int64_t>;

class Storage {
public:
    Storage(size_t nbytes, Device device);  // allocates through the device's runtime
    // Wraps memory owned elsewhere (a provider's host view of device memory); never freed here.
    Storage(void* data, size_t nbytes, Device device, bool owned)
        : data_(data), nbytes_(nbytes), device_(device), owned_(owned) {}
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() const { return data_; }
    size_t nbytes() const { return nbytes_; }
    const Device& device() const { return device_; }
    // Counts in-place writes (the dispatcher bumps it), so autograd can detect saved tensors that changed.
    uint64_t version() const { return version_; }
    void BumpVersion() { ++version_; }

private:
    void* data_ = nullptr;
    size_t nbytes_ = 0;
    Device device_;
    bool owned_ = true;
    uint64_t version_ = 0;
};

class Tensor {
public:
    Tensor() = default;
    static Tensor Empty(const Shape& shape, DataType dtype, Device device);
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
    // Copy to another device (or the same one); synchronous for the caller.
    Tensor To(const Device& device) const;
    // Copies this tensor's bytes into dst (same shape and dtype, any devices); synchronous.
    void CopyTo(const Tensor& dst) const;
    std::string ToString() const;  // "Tensor(float32[2, 3], cpu:0)"

private:
    std::shared_ptr<Storage> storage_;
    Shape shape_;
    int64_t numel_ = 0;
    size_t offset_ = 0;
    DataType dtype_ = DataType::kFloat32;
};

int64_t Numel(const Shape& shape);
std::string ShapeToString(const Shape& shape);

}  // namespace infinitrain
