#include "infinitrain/tensor.h"

#include <stdexcept>

#include "infinitrain/runtime.h"

namespace infinitrain {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
    // Zero-size tensors still get a distinct, valid pointer.
    data_ = GetRuntime(device.type).Malloc(nbytes ? nbytes : 1, device.index);
}

Storage::~Storage() {
    if (owned_) GetRuntime(device_.type).Free(data_, device_.index);
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

Tensor Tensor::Empty(const Shape& shape, DataType dtype, Device device) {
    for (int64_t s : shape) {
        if (s < 0) throw std::invalid_argument("negative dimension in shape " + ShapeToString(shape));
    }
    if (device.type != DeviceType::kCPU) {
        int count = GetRuntime(device.type).DeviceCount();
        if (device.index >= count) {
            throw std::invalid_argument("device " + device.ToString() + " does not exist: " +
                                        DeviceTypeName(device.type) + " has " + std::to_string(count) + " device(s)");
        }
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
    t.storage_ = std::make_shared<Storage>(static_cast<size_t>(nbytes), device);
    return t;
}

Tensor Tensor::FromBlob(void* data, const Shape& shape, DataType dtype, Device device) {
    Tensor t;
    t.shape_ = shape;
    t.numel_ = Numel(shape);
    t.dtype_ = dtype;
    t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(t.numel_) * DataTypeSize(dtype), device, false);
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

Tensor Tensor::To(const Device& dst) const {
    Tensor out = Empty(shape_, dtype_, dst);
    CopyTo(out);
    return out;
}

void Tensor::CopyTo(const Tensor& out) const {
    if (out.shape_ != shape_ || out.dtype_ != dtype_) {
        throw std::invalid_argument("copy: " + ToString() + " into " + out.ToString() + " needs equal shape and dtype");
    }
    size_t n = nbytes();
    if (n == 0) return;
    const Device& src = device();
    const Device& dst = out.device();
    if (src.is_cpu() && dst.is_cpu()) {
        GetRuntime(DeviceType::kCPU).Memcpy(out.data(), data(), n, MemcpyKind::kDeviceToDevice, 0);
    } else if (src.is_cpu()) {
        GetRuntime(dst.type).Memcpy(out.data(), data(), n, MemcpyKind::kHostToDevice, dst.index);
    } else if (dst.is_cpu()) {
        GetRuntime(src.type).Memcpy(out.data(), data(), n, MemcpyKind::kDeviceToHost, src.index);
    } else if (src.type == dst.type) {
        GetRuntime(src.type).Memcpy(out.data(), data(), n, MemcpyKind::kDeviceToDevice, src.index);
    } else {
        To(Device{}).CopyTo(out);
    }
}

std::string Tensor::ToString() const {
    if (!defined()) return "Tensor(undefined)";
    return std::string("Tensor(") + DataTypeName(dtype_) + ShapeToString(shape_) + ", " + device().ToString() + ")";
}

}  // namespace infinitrain
