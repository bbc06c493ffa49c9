// The op table and the dispatcher: calling ops, their schemas, how a device runs them, composites,
// the CPU fallback and poisoned outputs.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <new>
#include <string>

#include "infinitrain/allocator.h"
#include "infinitrain/op.h"
#include "infinitrain/profiler.h"
#include "python/csrc/bindings.h"

namespace infinitrain::python {
namespace {

py::list ToList(std::vector<Tensor> out) {
    py::list l(out.size());
    for (size_t i = 0; i < out.size(); ++i) l[i] = py::cast(std::move(out[i]));
    return l;
}

// Out of memory inside an op (an output from the allocator, or a kernel's own scratch as std::bad_alloc) raises
// OutOfMemoryError (a MemoryError) that names the op and, for a bare std::bad_alloc, its outputs' sizes.
std::vector<Tensor> CallNamingOom(const Op& op, const std::vector<Tensor>& in, const Attrs& attrs) {
    try {
        return op.Call(in, attrs);
    } catch (const OutOfMemoryError& e) {
        const std::string name = op.name();
        std::string what = e.what();
        if (what.rfind(name + ":", 0) == 0) throw;
        throw OutOfMemoryError(name + ": " + what);
    } catch (const std::bad_alloc& e) {
        const std::string name = op.name();
        std::string what = e.what();
        if (what.rfind(name + ":", 0) == 0) throw OutOfMemoryError(what);  // a kernel already said what
        std::string outs;
        try {
            for (const TensorMeta& m : op.Meta(in, attrs)) {
                double bytes = static_cast<double>(DataTypeSize(m.dtype));
                for (int64_t d : m.shape) bytes *= static_cast<double>(d);
                outs += (outs.empty() ? " with outputs " : ", ") + std::string(DataTypeName(m.dtype)) +
                        ShapeToString(m.shape) + " (" + std::to_string(static_cast<long long>(bytes)) + " bytes)";
            }
        } catch (...) {  // the sizes are best effort; the error still comes
        }
        throw OutOfMemoryError(name + ": out of memory (" + what + ")" + outs);
    }
}

const char* TierName(OpTier t) {
    switch (t) {
        case OpTier::kRequired:
            return "required";
        case OpTier::kFused:
            return "fused";
        case OpTier::kProvider:
            return "provider";
    }
    return "?";
}

const char* AttrTypeName(AttrType t) {
    switch (t) {
        case AttrType::kInt:
            return "int";
        case AttrType::kFloat:
            return "float";
        case AttrType::kInts:
            return "ints";
        case AttrType::kStr:
            return "str";
    }
    return "?";
}

std::string Join(const std::vector<std::string>& parts, const char* sep) {
    std::string out;
    for (const std::string& p : parts) out += (out.empty() ? "" : sep) + p;
    return out;
}

py::dict OpInfo(const Op& op) {
    const OpSchema& s = op.schema();
    py::dict d;
    d["name"] = s.name;
    d["schema"] = s.text;
    d["tier"] = TierName(s.tier);
    std::vector<std::string> ins, attrs, attr_names;
    for (const OpSchema::Input& i : s.inputs) ins.push_back(i.name + (i.optional ? "?" : i.variadic ? "..." : ""));
    for (const OpSchema::Attr& a : s.attrs) {
        attrs.push_back(a.name + ":" + AttrTypeName(a.type));
        attr_names.push_back(a.name);
    }
    d["inputs"] = Join(ins, ", ");
    d["attrs"] = Join(attrs, ", ");
    d["attr_names"] = attr_names;
    d["outputs"] = Join(s.outputs, ", ");
    d["dtypes"] = DtypeSetName(s.dtypes);
    d["backward"] = Join(s.backward, ", ");
    d["doc"] = s.doc;
    d["inplace"] = s.inplace;
    d["composite"] = op.HasComposite();
    py::dict kernels;
    for (int t = 0; t < kNumDeviceTypes; ++t) {
        DeviceType dt = static_cast<DeviceType>(t);
        if (op.HasKernel(dt)) kernels[py::str(DeviceTypeName(dt))] = op.KernelSite(dt);
    }
    d["kernels"] = kernels;
    return d;
}

// A Python composite: fn(list of native tensors, list of attributes) -> list of native tensors.
CompositeFn PythonComposite(py::function fn) {
    // Leaked with the op (ops live for the process), so no Python object is released without the GIL.
    auto* held = new py::function(std::move(fn));
    return [held](const std::vector<Tensor>& in, const Attrs& attrs) {
        py::gil_scoped_acquire gil;
        py::object r = (*held)(in, attrs);
        return r.is_none() ? std::vector<Tensor>{} : r.cast<std::vector<Tensor>>();
    };
}

}  // namespace

void BindOps(py::module_& m) {
    py::class_<Op, std::unique_ptr<Op, py::nodelete>>(m, "Op")
        .def_property_readonly("name", [](const Op& op) { return std::string(op.name()); })
        .def("__call__", [](const Op& op, const std::vector<Tensor>& in,
                            const Attrs& attrs) { return ToList(CallNamingOom(op, in, attrs)); })
        .def("call_composite", [](const Op& op, const std::vector<Tensor>& in,
                                  const Attrs& attrs) { return ToList(op.CallComposite(in, attrs)); })
        .def("meta",
             [](const Op& op, const std::vector<Tensor>& in, const Attrs& attrs) {
                 py::list l;
                 for (const TensorMeta& tm : op.Meta(in, attrs)) {
                     py::tuple shape(tm.shape.size());
                     for (size_t i = 0; i < tm.shape.size(); ++i) shape[i] = tm.shape[i];
                     l.append(py::make_tuple(shape, DataTypeName(tm.dtype)));
                 }
                 return l;
             })
        .def("written", [](const Op& op, int num_inputs) { return op.schema().Written(num_inputs); })
        .def("has_kernel", [](const Op& op, const std::string& device) { return op.HasKernel(Dev(device).type); })
        .def("how", [](const Op& op, const std::string& device) { return HowRunsName(op.How(Dev(device).type)); })
        .def("set_composite", [](Op& op, py::function fn) { op.SetComposite(PythonComposite(std::move(fn))); })
        .def("prefer_composite", &Op::PreferComposite)
        .def("info", &OpInfo);
    m.def(
        "op", [](const std::string& name) { return &GetMutableOp(name); }, py::return_value_policy::reference);
    m.def("ops", [] {
        py::list l;
        for (const Op* op : AllOps()) l.append(OpInfo(*op));
        return l;
    });
    m.def("set_poison_outputs", &SetPoisonOutputs);
    m.def("set_float32_matmul_precision", [](const std::string& p) {
        if (p == "highest") return SetFloat32MatmulPrecision(MatmulPrecision::kHighest);
        if (p == "high") return SetFloat32MatmulPrecision(MatmulPrecision::kHigh);
        if (p == "medium") return SetFloat32MatmulPrecision(MatmulPrecision::kMedium);
        throw py::value_error("float32 matmul precision must be 'highest', 'high' or 'medium', got '" + p + "'");
    });
    m.def("float32_matmul_precision", [] {
        switch (Float32MatmulPrecision()) {
            case MatmulPrecision::kHigh:
                return "high";
            case MatmulPrecision::kMedium:
                return "medium";
            default:
                return "highest";
        }
    });
    m.def("start_profiling", &StartProfiling);
    m.def("stop_profiling", [] {
        std::vector<OpTiming> records;
        {
            py::gil_scoped_release release;  // waits for the device
            records = StopProfiling();
        }
        py::list out;
        for (const OpTiming& r : records) {
            out.append(
                py::make_tuple(r.op, r.device.ToString(), r.host_start_us, r.host_us, r.device_start_ms, r.device_ms));
        }
        return out;
    });
    m.def("set_cpu_fallback",
          [](const std::string& device_type, bool on) { SetCpuFallback(Dev(device_type).type, on); });
    m.def("cpu_fallback", [](const std::string& device_type) { return CpuFallback(Dev(device_type).type); });
}

}  // namespace infinitrain::python
