#include "infinitrain/tensor.h"

#include <cstring>
#include <stdexcept>

#include "infinitrain/runtime.h"

namespace infinitrain {

Storage::Storage(size_t nbytes, Device device, bool pinned, size_t slack)
    : nbytes_(nbytes), device_(device), pinned_(pinned) {
    // Zero-size tensors still get a distinct, valid block.
    if (pinned) {
        if (!device.is_cpu()) throw std::invalid_argument("only cpu memory can be pinned, not " + device.ToString());
        block_ = PinnedAllocator().Allocate(nbytes + slack, Stream());
    } else {
        block_ = DeviceAllocator(device).Allocate(nbytes + slack, CurrentStream(device));
    }
    data_ = block_->ptr;
}

Storage::~Storage() {
    if (block_) block_->owner->Free(block_);
}

int64_t Numel(const Shape& shape) {
    int64_t n = 1;
    for (int64_t s : shape) {
        if (__builtin_mul_overflow(n, s, &n)) {
            throw std::invalid_argument("shape " + ShapeToString(shape) + " has more elements than fit in int64");
        }
    }
    return n;
}

std::string ShapeToString(const Shape& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

Tensor Tensor::Allocate(const Shape& shape, DataType dtype, Device device, bool pinned, size_t guard) {
    for (int64_t s : shape) {
        if (s < 0) throw std::invalid_argument("negative dimension in shape " + ShapeToString(shape));
    }
    Tensor t;
    t.shape_ = shape;
    t.numel_ = Numel(shape);
    t.dtype_ = dtype;
    int64_t nbytes;
    if (__builtin_mul_overflow(t.numel_, static_cast<int64_t>(DataTypeSize(dtype)), &nbytes)) {
        throw std::invalid_argument("shape " + ShapeToString(shape) + " of " + DataTypeName(dtype) +
                                    " is too large to allocate");
    }
    t.storage_ = std::make_shared<Storage>(static_cast<size_t>(nbytes), device, pinned, guard);
    return t;
}

Tensor Tensor::EmptyGuarded(const Shape& shape, DataType dtype, Device device, size_t guard) {
    return Allocate(shape, dtype, device, false, guard);
}

Tensor Tensor::Empty(const Shape& shape, DataType dtype, Device device) {
    return Allocate(shape, dtype, device, false);
}

Tensor Tensor::EmptyPinned(const Shape& shape, DataType dtype) { return Allocate(shape, dtype, Device{}, true); }

Tensor Tensor::FromBlob(void* data, const Shape& shape, DataType dtype, Device device) {
    Tensor t;
    t.shape_ = shape;
    t.numel_ = Numel(shape);
    t.dtype_ = dtype;
    t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(t.numel_) * DataTypeSize(dtype), device);
    return t;
}

int64_t Tensor::size(int64_t d) const {
    int64_t n = dim();
    if (d < -n || d >= n) {
        throw std::out_of_range("dimension " + std::to_string(d) + " out of range for a " + std::to_string(n) +
                                "-d tensor");
    }
    return shape_[d < 0 ? d + n : d];
}

Tensor Tensor::Reshape(const Shape& shape) const {
    Shape out = shape;
    int64_t known = 1, infer = -1;
    for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] == -1) {
            if (infer >= 0) throw std::invalid_argument("reshape: only one dimension may be -1");
            infer = static_cast<int64_t>(i);
        } else if (out[i] < 0) {
            throw std::invalid_argument("reshape: negative dimension in " + ShapeToString(shape));
        } else {
            known *= out[i];
        }
    }
    if (infer >= 0) {
        if (known == 0 || numel_ % known != 0) {
            throw std::invalid_argument("reshape: cannot view shape " + ShapeToString(shape_) + " as " +
                                        ShapeToString(shape));
        }
        out[infer] = numel_ / known;
    }
    if (Numel(out) != numel_) {
        throw std::invalid_argument("reshape: shape " + ShapeToString(shape) + " has " + std::to_string(Numel(out)) +
                                    " elements, the tensor has " + std::to_string(numel_) + " (shape " +
                                    ShapeToString(shape_) + ")");
    }
    Tensor t = *this;
    t.shape_ = out;
    return t;
}

Tensor Tensor::To(const Device& dst, bool non_blocking) const {
    bool pinned = dst.is_cpu() && non_blocking && !device().is_cpu();
    Tensor out = pinned ? EmptyPinned(shape_, dtype_) : Empty(shape_, dtype_, dst);
    CopyTo(out, non_blocking);
    return out;
}

void Tensor::CopyTo(const Tensor& out, bool non_blocking) const {
    if (out.shape_ != shape_ || out.dtype_ != dtype_) {
        throw std::invalid_argument("copy: " + ToString() + " into " + out.ToString() + " needs equal shape and dtype");
    }
    size_t n = nbytes();
    if (n == 0) return;
    const Device& src = device();
    const Device& dst = out.device();
    if (src.is_cpu() && dst.is_cpu()) {
        std::memmove(out.data(), data(), n);
        return;
    }
    if (!src.is_cpu() && !dst.is_cpu() && src != dst) {
        To(Device{}).CopyTo(out);  // between devices: through the host
        return;
    }
    const Device& dev = src.is_cpu() ? dst : src;
    MemcpyKind kind = src.is_cpu()   ? MemcpyKind::kHostToDevice
                      : dst.is_cpu() ? MemcpyKind::kDeviceToHost
                                     : MemcpyKind::kDeviceToDevice;
    DeviceRuntime& rt = GetRuntime(dev.type);
    Stream stream = CurrentStream(dev);
    DeviceGuard guard(dev);
    rt.MemcpyAsync(out.data(), data(), n, kind, stream);
    storage_->RecordStream(stream);
    out.storage_->RecordStream(stream);
    // Pageable host sources are staged by the runtime; everything else the host reads or writes waits.
    bool wait = kind == MemcpyKind::kHostToDevice   ? is_pinned() && !non_blocking
                : kind == MemcpyKind::kDeviceToHost ? !(non_blocking && out.is_pinned())
                                                    : false;
    if (wait) rt.SynchronizeStream(stream);
}

std::string Tensor::ToString() const {
    if (!defined()) return "Tensor(undefined)";
    return std::string("Tensor(") + DataTypeName(dtype_) + ShapeToString(shape_) + ", " + device().ToString() + ")";
}

}  // namespace infinitrain
