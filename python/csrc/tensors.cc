// Tensors: creation from NumPy, host copies, device copies, pinned memory.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>

#include "infinitrain/fp8.h"
#include "infinitrain/tensor.h"
#include "python/csrc/bindings.h"

namespace infinitrain::python {
namespace {

// NumPy dtype for a DataType; bfloat16 and the float8 types have none, so they travel as float32.
py::dtype NumpyDtype(DataType t) {
    switch (t) {
        case DataType::kBool:
            return py::dtype("bool");
        case DataType::kUInt8:
            return py::dtype("uint8");
        case DataType::kInt8:
            return py::dtype("int8");
        case DataType::kInt32:
            return py::dtype("int32");
        case DataType::kInt64:
            return py::dtype("int64");
        case DataType::kFloat16:
            return py::dtype("float16");
        case DataType::kFloat64:
            return py::dtype("float64");
        default:
            return py::dtype("float32");
    }
}

py::tuple ShapeTuple(const Shape& s) {
    py::tuple t(s.size());
    for (size_t i = 0; i < s.size(); ++i) t[i] = s[i];
    return t;
}

py::array ToNumpy(const Tensor& t) {
    Tensor h = t;
    if (!t.device().is_cpu()) {
        // Waiting for the device must not hold the GIL: other threads may still have to issue work it waits on.
        py::gil_scoped_release release;
        h = t.To(Device{});
    }
    py::array out(NumpyDtype(h.dtype()), h.shape());
    if (h.dtype() == DataType::kBFloat16) {
        const uint16_t* src = h.data<uint16_t>();
        float* dst = static_cast<float*>(out.mutable_data());
        for (int64_t i = 0; i < h.numel(); ++i) dst[i] = BF16ToFloat(src[i]);
    } else if (IsFloat8(h.dtype())) {
        const uint8_t* src = h.data<uint8_t>();
        float* dst = static_cast<float*>(out.mutable_data());
        bool e5m2 = h.dtype() == DataType::kFloat8E5M2;
        for (int64_t i = 0; i < h.numel(); ++i) dst[i] = e5m2 ? Fp8ToFloat<true>(src[i]) : Fp8ToFloat<false>(src[i]);
    } else if (h.nbytes()) {
        std::memcpy(out.mutable_data(), h.data(), h.nbytes());
    }
    return out;
}

// Copies `arr` (C-contiguous, NumPy dtype carrying `dt`: float32 for bfloat16) into cpu tensor t.
void FillFromNumpy(const Tensor& t, const py::array& arr, DataType dt) {
    if (dt == DataType::kBFloat16) {
        const float* src = static_cast<const float*>(arr.data());
        uint16_t* dst = t.data<uint16_t>();
        for (int64_t i = 0; i < t.numel(); ++i) dst[i] = FloatToBF16(src[i]);
    } else if (IsFloat8(dt)) {
        const float* src = static_cast<const float*>(arr.data());
        uint8_t* dst = t.data<uint8_t>();
        bool e5m2 = dt == DataType::kFloat8E5M2;
        for (int64_t i = 0; i < t.numel(); ++i) dst[i] = e5m2 ? FloatToFp8<true>(src[i]) : FloatToFp8<false>(src[i]);
    } else if (t.nbytes()) {
        std::memcpy(t.data(), arr.data(), t.nbytes());
    }
}

Tensor FromNumpy(py::array arr, const std::string& dtype, const std::string& device, bool pinned) {
    DataType dt = ParseDataType(dtype);
    if (!(arr.flags() & py::array::c_style)) throw std::invalid_argument("from_numpy: array must be C-contiguous");
    if (!arr.dtype().is(NumpyDtype(dt))) {
        throw std::invalid_argument("from_numpy: array dtype " + std::string(py::str(arr.dtype())) +
                                    " does not carry " + dtype);
    }
    Shape shape(arr.shape(), arr.shape() + arr.ndim());
    Device d = Dev(device);
    Tensor t = pinned ? Tensor::EmptyPinned(shape, dt) : Tensor::Empty(shape, dt, Device{});
    FillFromNumpy(t, arr, dt);
    if (d.is_cpu()) return t;
    py::gil_scoped_release release;
    return t.To(d);
}

// A NumPy array over a cpu tensor's memory (no copy; bfloat16 shows its raw uint16 bits, float8 its uint8 bits).
py::array HostArray(const Tensor& t) {
    if (!t.device().is_cpu()) throw std::invalid_argument("host_array: " + t.ToString() + " is not on the cpu");
    py::dtype dt = t.dtype() == DataType::kBFloat16 ? py::dtype("uint16")
                   : IsFloat8(t.dtype())            ? py::dtype("uint8")
                                                    : NumpyDtype(t.dtype());
    py::object owner = py::cast(t);  // keeps the storage alive while the array lives
    return py::array(dt, t.shape(), t.data(), owner);
}

}  // namespace

void BindTensors(py::module_& m) {
    py::class_<Tensor>(m, "Tensor")
        .def_property_readonly("shape", [](const Tensor& t) { return ShapeTuple(t.shape()); })
        .def_property_readonly("dtype",
                               [](const Tensor& t) {
                                   // Interned names: this is read on every op's Python path.
                                   static py::str* names = [] {
                                       auto* n = new py::str[kNumDataTypes];
                                       for (int i = 0; i < kNumDataTypes; ++i) {
                                           n[i] = py::reinterpret_steal<py::str>(
                                               PyUnicode_InternFromString(DataTypeName(static_cast<DataType>(i))));
                                       }
                                       return n;
                                   }();
                                   return names[static_cast<int>(t.dtype())];
                               })
        .def_property_readonly("device", [](const Tensor& t) { return t.device().ToString(); })
        .def_property_readonly("numel", &Tensor::numel)
        .def_property_readonly("version", [](const Tensor& t) { return t.storage()->version(); })
        .def_property_readonly("nbytes", &Tensor::nbytes)
        .def_property_readonly("is_pinned", &Tensor::is_pinned)
        .def_property_readonly("sole_owner", &Tensor::SoleOwner)
        // The raw address (a device address for device tensors): for tests and interop.
        .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()); })
        .def("reshape", &Tensor::Reshape)
        .def(
            "to",
            [](const Tensor& t, const std::string& d, bool non_blocking) {
                Device dev = Dev(d);
                py::gil_scoped_release release;  // the copy may wait for the device
                return t.To(dev, non_blocking);
            },
            py::arg("device"), py::arg("non_blocking") = false)
        .def(
            "copy_from",
            [](const Tensor& dst, const Tensor& src, bool non_blocking) {
                py::gil_scoped_release release;
                src.CopyTo(dst, non_blocking);
            },
            py::arg("src"), py::arg("non_blocking") = false)
        .def("pin_memory",
             [](const Tensor& t) {
                 if (!t.device().is_cpu())
                     throw std::invalid_argument("pin_memory: " + t.ToString() + " is not on the cpu");
                 if (t.is_pinned()) return t;
                 Tensor p = Tensor::EmptyPinned(t.shape(), t.dtype());
                 t.CopyTo(p);
                 return p;
             })
        .def("numpy", &ToNumpy)
        .def("host_array", &HostArray)
        .def("same_storage", [](const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); })
        .def("__repr__", &Tensor::ToString);

    m.def(
        "empty",
        [](const Shape& shape, const std::string& dtype, const std::string& device, bool pinned) {
            DataType dt = ParseDataType(dtype);
            Device d = Dev(device);
            if (pinned) {
                if (!d.is_cpu()) throw std::invalid_argument("empty: only cpu tensors can be pinned, not " + device);
                return Tensor::EmptyPinned(shape, dt);
            }
            return Tensor::Empty(shape, dt, d);
        },
        py::arg("shape"), py::arg("dtype"), py::arg("device"), py::arg("pinned") = false);
    m.def("from_numpy", &FromNumpy, py::arg("array"), py::arg("dtype"), py::arg("device"), py::arg("pinned") = false);
}

}  // namespace infinitrain::python
