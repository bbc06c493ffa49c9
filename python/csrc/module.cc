// infinitrain._C: the native core as seen from Python. Tensors, the op
// table and dispatcher, device runtimes and provider registration.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <typeinfo>

#include "infinitrain/ccl.h"
#include "infinitrain/op.h"
#include "infinitrain/privateuse1.h"
#include "infinitrain/provider.h"
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
    if (d.is_cpu()) return t;
    py::gil_scoped_release release;
    return t.To(d);
}

// A bare std::bad_alloc reaches Python as MemoryError("std::bad_alloc"); this one says what was allocated.
class NamedBadAlloc : public std::bad_alloc {
public:
    explicit NamedBadAlloc(std::string what) : what_(std::move(what)) {}
    const char* what() const noexcept override { return what_.c_str(); }

private:
    std::string what_;
};

std::string DescribeBytes(const Shape& shape, DataType dtype) {
    double bytes = static_cast<double>(DataTypeSize(dtype));
    for (int64_t d : shape) bytes *= static_cast<double>(d);
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    for (; bytes >= 1024 && u < 6; ++u) bytes /= 1024;
    char buf[48];
    std::snprintf(buf, sizeof(buf), u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
    return std::string(DataTypeName(dtype)) + ShapeToString(shape) + " (" + buf + ")";
}

[[noreturn]] void RethrowNamedBadAlloc(const std::bad_alloc& e, const std::string& what) {
    if (typeid(e) != typeid(std::bad_alloc) && typeid(e) != typeid(std::bad_array_new_length)) throw;
    throw NamedBadAlloc(what);
}

py::list RunOp(const Op& op, const std::vector<Tensor>& in, const Attrs& attrs) {
    std::vector<Tensor> out;
    try {
        out = op.Call(in, attrs);
    } catch (const std::bad_alloc& e) {
        std::string outs;
        try {
            for (const TensorMeta& m : op.Meta(in, attrs)) {
                outs += (outs.empty() ? "" : ", ") + DescribeBytes(m.shape, m.dtype);
            }
        } catch (...) {  // the message is best effort; the MemoryError still comes
        }
        RethrowNamedBadAlloc(
            e, std::string(op.name()) + ": out of memory" + (outs.empty() ? "" : " with outputs " + outs));
    }
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

// Unknown device names ask infinitrain.backends to import and register a provider of that name.
bool ResolveDevice(const std::string& name) {
    static thread_local bool busy = false;
    if (busy) return false;
    busy = true;
    bool ok = false;
    try {
        py::gil_scoped_acquire gil;
        ok = py::module_::import("infinitrain.backends").attr("_resolve")(name).cast<bool>();
    } catch (...) {
        busy = false;
        throw;
    }
    busy = false;
    return ok;
}

// A stream or event handle with the device it belongs to; owned handles are destroyed with the object.
struct StreamHandle {
    Device device;
    Stream stream;
    bool owned;
    StreamHandle(Device d, Stream s, bool o) : device(d), stream(s), owned(o) {}
    StreamHandle(const StreamHandle&) = delete;
    ~StreamHandle() {
        if (owned && stream) GetRuntime(device.type).DestroyStream(stream, device.index);
    }
};

struct EventHandle {
    Device device;
    Event event;
    EventHandle(Device d, Event e) : device(d), event(e) {}
    EventHandle(const EventHandle&) = delete;
    ~EventHandle() { GetRuntime(device.type).DestroyEvent(event, device.index); }
};

struct CommHandle {
    std::unique_ptr<Communicator> comm;
};

// Collective buffers: on the communicator's device, one dtype, the element counts the collective needs.
void CheckCollective(const CommHandle& c, const std::vector<Tensor>& ts, int64_t want, int64_t got) {
    for (const Tensor& t : ts) {
        if (t.device() != c.comm->device()) {
            throw std::invalid_argument("collective buffer on " + t.device().ToString() + ", communicator on " +
                                        c.comm->device().ToString());
        }
        if (t.dtype() != ts[0].dtype()) throw std::invalid_argument("collective buffers must share one dtype");
    }
    if (want != got) {
        throw std::invalid_argument("collective buffer sizes do not match: expected " + std::to_string(want) +
                                    " elements, got " + std::to_string(got));
    }
}

void CheckRoot(const CommHandle& c, int r) {
    if (r < 0 || r >= c.comm->size()) {
        throw std::invalid_argument("rank " + std::to_string(r) + " out of range for a group of " +
                                    std::to_string(c.comm->size()));
    }
}

Stream StreamOf(const std::optional<std::shared_ptr<StreamHandle>>& s, const Device& d) {
    if (!s || !*s) return CurrentStream(d);
    if ((*s)->device != d) {
        throw std::invalid_argument("stream belongs to " + (*s)->device.ToString() + ", not " + d.ToString());
    }
    return (*s)->stream;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "infinitrain native core";
    CheckRegistrations();

    py::register_exception<MissingKernelError>(m, "MissingKernelError", PyExc_NotImplementedError);

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
        // The raw address (a device address for device tensors): for tests and interop.
        .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()); })
        .def("reshape", &Tensor::Reshape)
        .def("to",
             [](const Tensor& t, const std::string& d) {
                 Device dev = Dev(d);
                 py::gil_scoped_release release;  // the copy may wait for the device
                 return t.To(dev);
             })
        .def("numpy", &ToNumpy)
        .def("same_storage", [](const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); })
        .def("__repr__", &Tensor::ToString);

    m.def("empty", [](const Shape& shape, const std::string& dtype, const std::string& device) {
        DataType dt = ParseDataType(dtype);
        Device d = Dev(device);
        try {
            return Tensor::Empty(shape, dt, d);
        } catch (const std::bad_alloc& e) {
            RethrowNamedBadAlloc(e,
                                 "empty: out of memory allocating " + DescribeBytes(shape, dt) + " on " + d.ToString());
        }
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
    m.def("set_cpu_fallback", &SetCpuFallback);
    m.def("cpu_fallback", &CpuFallback);
    SetWarningHandler([](const std::string& msg) {
        py::gil_scoped_acquire gil;
        PyErr_WarnEx(PyExc_RuntimeWarning, msg.c_str(), 1);
    });
    SetDeviceResolver(&ResolveDevice);
    m.def("loaded_providers", &LoadedProviders);

    py::class_<StreamHandle, std::shared_ptr<StreamHandle>>(m, "Stream")
        .def(py::init([](const std::string& dev) {
                 Device d = Dev(dev);
                 return std::make_shared<StreamHandle>(d, GetRuntime(d.type).CreateStream(d.index), true);
             }),
             py::arg("device"))
        .def_property_readonly("device", [](const StreamHandle& s) { return s.device.ToString(); })
        .def("synchronize",
             [](const StreamHandle& s) {
                 py::gil_scoped_release release;
                 GetRuntime(s.device.type).SynchronizeStream(s.stream, s.device.index);
             })
        .def("wait_event", [](const StreamHandle& s, const EventHandle& e) {
            if (e.device != s.device) throw std::invalid_argument("event and stream are on different devices");
            GetRuntime(s.device.type).StreamWaitEvent(s.stream, e.event, s.device.index);
        });
    m.def("default_stream", [](const std::string& dev) {
        Device d = Dev(dev);
        return std::make_shared<StreamHandle>(d, nullptr, false);
    });
    m.def("set_current_stream", [](const std::shared_ptr<StreamHandle>& s) { SetCurrentStream(s->device, s->stream); });
    m.def("current_stream", [](const std::string& dev) {
        Device d = Dev(dev);
        return std::make_shared<StreamHandle>(d, CurrentStream(d), false);
    });

    py::class_<EventHandle, std::shared_ptr<EventHandle>>(m, "Event")
        .def(py::init([](const std::string& dev) {
                 Device d = Dev(dev);
                 return std::make_shared<EventHandle>(d, GetRuntime(d.type).CreateEvent(d.index));
             }),
             py::arg("device"))
        .def(
            "record",
            [](const EventHandle& e, std::optional<std::shared_ptr<StreamHandle>> s) {
                GetRuntime(e.device.type).RecordEvent(e.event, StreamOf(s, e.device), e.device.index);
            },
            py::arg("stream") = py::none())
        .def("query",
             [](const EventHandle& e) { return GetRuntime(e.device.type).QueryEvent(e.event, e.device.index); })
        .def("synchronize",
             [](const EventHandle& e) {
                 py::gil_scoped_release release;
                 GetRuntime(e.device.type).SynchronizeEvent(e.event, e.device.index);
             })
        .def("elapsed_ms", [](const EventHandle& start, const EventHandle& end) {
            if (start.device != end.device) throw std::invalid_argument("events are on different devices");
            return GetRuntime(start.device.type).ElapsedMs(start.event, end.event, start.device.index);
        });

    py::class_<CommHandle, std::shared_ptr<CommHandle>>(m, "Communicator")
        .def_property_readonly("rank", [](const CommHandle& c) { return c.comm->rank(); })
        .def_property_readonly("size", [](const CommHandle& c) { return c.comm->size(); })
        .def_property_readonly("device", [](const CommHandle& c) { return c.comm->device().ToString(); })
        .def("async_error", [](const CommHandle& c) { return c.comm->AsyncError(); })
        .def("all_reduce",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv, const std::string& op) {
                 CheckCollective(c, {send, recv}, send.numel(), recv.numel());
                 c.comm->AllReduce(send.data(), recv.data(), send.numel(), send.dtype(), ParseReduceOp(op),
                                   CurrentStream(c.comm->device()));
             })
        .def("broadcast",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv, int root) {
                 CheckCollective(c, {send, recv}, send.numel(), recv.numel());
                 CheckRoot(c, root);
                 c.comm->Broadcast(send.data(), recv.data(), send.numel(), send.dtype(), root,
                                   CurrentStream(c.comm->device()));
             })
        .def("reduce",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv, const std::string& op, int root) {
                 CheckCollective(c, {send, recv}, send.numel(), recv.numel());
                 CheckRoot(c, root);
                 c.comm->Reduce(send.data(), recv.data(), send.numel(), send.dtype(), ParseReduceOp(op), root,
                                CurrentStream(c.comm->device()));
             })
        .def("all_gather",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv) {
                 CheckCollective(c, {send, recv}, send.numel() * c.comm->size(), recv.numel());
                 c.comm->AllGather(send.data(), recv.data(), send.numel(), send.dtype(),
                                   CurrentStream(c.comm->device()));
             })
        .def("reduce_scatter",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv, const std::string& op) {
                 CheckCollective(c, {send, recv}, send.numel(), recv.numel() * c.comm->size());
                 c.comm->ReduceScatter(send.data(), recv.data(), recv.numel(), send.dtype(), ParseReduceOp(op),
                                       CurrentStream(c.comm->device()));
             })
        .def("send",
             [](const CommHandle& c, const Tensor& buf, int peer) {
                 CheckCollective(c, {buf}, 0, 0);
                 CheckRoot(c, peer);
                 c.comm->Send(buf.data(), buf.numel(), buf.dtype(), peer, CurrentStream(c.comm->device()));
             })
        .def("recv", [](const CommHandle& c, const Tensor& buf, int peer) {
            CheckCollective(c, {buf}, 0, 0);
            CheckRoot(c, peer);
            c.comm->Recv(buf.data(), buf.numel(), buf.dtype(), peer, CurrentStream(c.comm->device()));
        });
    m.def("ccl_init_all", [](const std::vector<std::string>& devs) {
        if (devs.empty()) throw std::invalid_argument("ccl_init_all: expected at least one device");
        std::vector<Device> ds;
        for (const std::string& s : devs) ds.push_back(Dev(s));
        for (const Device& d : ds) {
            if (d.type != ds[0].type) throw std::invalid_argument("ccl_init_all: devices must share one type");
        }
        std::vector<std::unique_ptr<Communicator>> comms;
        {
            py::gil_scoped_release release;
            comms = GetCcl(ds[0].type).InitAll(ds);
        }
        py::list out;
        for (auto& c : comms) out.append(std::make_shared<CommHandle>(CommHandle{std::move(c)}));
        return out;
    });
    m.def("ccl_unique_id", [](const std::string& type) {
        CclUniqueId id = GetCcl(Dev(type).type).GetUniqueId();
        return py::bytes(reinterpret_cast<const char*>(id.data()), id.size());
    });
    m.def("ccl_init_rank", [](const py::bytes& id, int nranks, int rank, const std::string& dev) {
        std::string raw = id;
        CclUniqueId uid{};
        if (raw.size() != uid.size()) throw std::invalid_argument("ccl_init_rank: unique id must be 128 bytes");
        std::copy(raw.begin(), raw.end(), uid.begin());
        if (nranks < 1 || rank < 0 || rank >= nranks) {
            throw std::invalid_argument("ccl_init_rank: need 0 <= rank < nranks");
        }
        Device d = Dev(dev);
        std::unique_ptr<Communicator> comm;
        {
            py::gil_scoped_release release;
            comm = GetCcl(d.type).InitRank(uid, nranks, rank, d);
        }
        return std::make_shared<CommHandle>(CommHandle{std::move(comm)});
    });
    m.def("ccl_group_start", [](const std::string& type) { GetCcl(Dev(type).type).GroupStart(); });
    m.def("ccl_group_end", [](const std::string& type) {
        py::gil_scoped_release release;
        GetCcl(Dev(type).type).GroupEnd();
    });
    m.def("has_ccl", [](const std::string& type) { return HasCcl(Dev(type).type); });

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
