// infinitrain._C: the native core as seen from Python. Tensors, the op
// table and dispatcher, device runtimes and provider registration.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "infinitrain/op.h"
#include "infinitrain/privateuse1.h"
#include "infinitrain/runtime.h"
#include "infinitrain/tensor.h"

namespace py = pybind11;
using namespace infinitrain;

namespace {

// NumPy dtype for a DataType; bfloat16 has none, so it travels as float32.
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
    Tensor h = t.device().is_cpu() ? t : t.To(Device{});
    py::array out(NumpyDtype(h.dtype()), h.shape());
    if (h.dtype() == DataType::kBFloat16) {
        const uint16_t* src = h.data<uint16_t>();
        float* dst = static_cast<float*>(out.mutable_data());
        for (int64_t i = 0; i < h.numel(); ++i) dst[i] = BF16ToFloat(src[i]);
    } else if (h.nbytes()) {
        std::memcpy(out.mutable_data(), h.data(), h.nbytes());
    }
    return out;
}

// `arr` must be C-contiguous with the NumPy dtype matching `dtype` (float32 for bfloat16).
Tensor FromNumpy(py::array arr, const std::string& dtype, const std::string& device) {
    DataType dt = ParseDataType(dtype);
    if (!(arr.flags() & py::array::c_style)) throw std::invalid_argument("from_numpy: array must be C-contiguous");
    if (!arr.dtype().is(NumpyDtype(dt))) {
        throw std::invalid_argument("from_numpy: array dtype " + std::string(py::str(arr.dtype())) +
                                    " does not carry " + dtype);
    }
    Shape shape(arr.shape(), arr.shape() + arr.ndim());
    Tensor t = Tensor::Empty(shape, dt, Device{});
    if (dt == DataType::kBFloat16) {
        const float* src = static_cast<const float*>(arr.data());
        uint16_t* dst = t.data<uint16_t>();
        for (int64_t i = 0; i < t.numel(); ++i) dst[i] = FloatToBF16(src[i]);
    } else if (t.nbytes()) {
        std::memcpy(t.data(), arr.data(), t.nbytes());
    }
    Device d = ParseDevice(device);
    return d.is_cpu() ? t : t.To(d);
}

py::list RunOp(const Op& op, const std::vector<Tensor>& in, const Attrs& attrs) {
    std::vector<Tensor> out = op.Call(in, attrs);
    py::list l(out.size());
    for (size_t i = 0; i < out.size(); ++i) l[i] = py::cast(std::move(out[i]));
    return l;
}

py::dict OpInfo(const Op& op) {
    const OpSchema& s = op.schema();
    py::dict d;
    d["name"] = s.name;
    d["tier"] = s.tier == OpTier::kRequired ? "required" : "fused";
    d["inputs"] = s.inputs;
    d["attrs"] = s.attrs;
    d["outputs"] = s.outputs;
    d["dtypes"] = s.dtypes;
    d["backward"] = s.backward;
    d["doc"] = s.doc;
    d["inplace"] = s.inplace;
    py::dict kernels;
    for (int t = 0; t < kNumDeviceTypes; ++t) {
        DeviceType dt = static_cast<DeviceType>(t);
        if (op.HasKernel(dt)) kernels[py::str(DeviceTypeName(dt))] = op.KernelSite(dt);
    }
    d["kernels"] = kernels;
    return d;
}

Device Dev(const std::string& spec) { return ParseDevice(spec); }

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "infinitrain native core";
    CheckRegistrations();

    py::register_exception<MissingKernelError>(m, "MissingKernelError", PyExc_NotImplementedError);

    py::class_<Tensor>(m, "Tensor")
        .def_property_readonly("shape", [](const Tensor& t) { return ShapeTuple(t.shape()); })
        .def_property_readonly("dtype", [](const Tensor& t) { return std::string(DataTypeName(t.dtype())); })
        .def_property_readonly("device", [](const Tensor& t) { return t.device().ToString(); })
        .def_property_readonly("numel", &Tensor::numel)
        .def_property_readonly("nbytes", &Tensor::nbytes)
        .def("reshape", &Tensor::Reshape)
        .def("to", [](const Tensor& t, const std::string& d) { return t.To(Dev(d)); })
        .def("numpy", &ToNumpy)
        .def("same_storage", [](const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); })
        .def("__repr__", &Tensor::ToString);

    m.def("empty", [](const Shape& shape, const std::string& dtype, const std::string& device) {
        return Tensor::Empty(shape, ParseDataType(dtype), Dev(device));
    });
    m.def("from_numpy", &FromNumpy, py::arg("array"), py::arg("dtype"), py::arg("device"));

    py::class_<Op, std::unique_ptr<Op, py::nodelete>>(m, "Op")
        .def_property_readonly("name", [](const Op& op) { return std::string(op.name()); })
        .def("__call__", &RunOp)
        .def("meta",
             [](const Op& op, const std::vector<Tensor>& in, const Attrs& attrs) {
                 py::list l;
                 for (const TensorMeta& tm : op.Meta(in, attrs)) {
                     l.append(py::make_tuple(ShapeTuple(tm.shape), DataTypeName(tm.dtype)));
                 }
                 return l;
             })
        .def("has_kernel", [](const Op& op, const std::string& device) { return op.HasKernel(Dev(device).type); })
        .def("info", &OpInfo);
    m.def(
        "op", [](const std::string& name) { return &GetOp(name); }, py::return_value_policy::reference);
    m.def("ops", [] {
        py::list l;
        for (const Op* op : AllOps()) l.append(OpInfo(*op));
        return l;
    });
    m.def("set_poison_outputs", &SetPoisonOutputs);

    m.def("parse_device", [](const std::string& s) { return Dev(s).ToString(); });
    m.def("device_count", [](const std::string& type) {
        Device d = Dev(type);
        return GetRuntime(d.type).DeviceCount();
    });
    m.def("synchronize", [](const std::string& dev) {
        Device d = Dev(dev);
        py::gil_scoped_release release;
        GetRuntime(d.type).SynchronizeDevice(d.index);
    });
    m.def("memory_stats", [](const std::string& dev) {
        Device d = Dev(dev);
        MemoryStats s = GetRuntime(d.type).GetMemoryStats(d.index);
        py::dict r;
        r["allocated"] = s.allocated;
        r["reserved"] = s.reserved;
        r["peak_allocated"] = s.peak_allocated;
        r["num_allocs"] = s.num_allocs;
        return r;
    });
    m.def("reset_peak_memory", [](const std::string& dev) {
        Device d = Dev(dev);
        GetRuntime(d.type).ResetPeakMemory(d.index);
    });

    m.def("register_privateuse1",
          [](const std::string& name, const std::string& autocast_dtype, const std::vector<std::string>& caps) {
              RegisterPrivateUse1({name, ParseDataType(autocast_dtype), caps});
          });
    m.def("privateuse1", []() -> py::object {
        const PrivateUse1Info* p = GetPrivateUse1();
        if (!p) return py::none();
        py::dict d;
        d["name"] = p->name;
        d["autocast_dtype"] = DataTypeName(p->autocast_dtype);
        d["capabilities"] = p->capabilities;
        return std::move(d);
    });
}
