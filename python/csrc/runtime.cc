// Devices, streams, events and memory statistics of every device type, and provider registration state.
#include "infinitrain/runtime.h"

#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "infinitrain/allocator.h"
#include "infinitrain/cpu_threads.h"
#include "infinitrain/privateuse1.h"
#include "infinitrain/provider.h"
#include "python/csrc/bindings.h"

namespace infinitrain::python {
namespace {

// An event owned by its Python object.
struct EventHandle {
    OwnedEvent event;
    explicit EventHandle(const Device& d) : event(d) {}
    const Event& get() const { return event.get(); }
};

Stream StreamArg(const std::optional<Stream>& s, const Device& d) {
    if (!s) return CurrentStream(d);
    if (s->device() != d) {
        throw std::invalid_argument("stream belongs to " + s->device().ToString() + ", not " + d.ToString());
    }
    return *s;
}

py::dict StatsDict(const MemoryStats& s) {
    py::dict r;
    r["allocated"] = s.allocated;
    r["reserved"] = s.reserved;
    r["cached"] = s.cached;
    r["pending"] = s.pending;
    r["peak_allocated"] = s.peak_allocated;
    r["peak_reserved"] = s.peak_reserved;
    r["num_allocs"] = s.num_allocs;
    r["num_ooms"] = s.num_ooms;
    return r;
}

}  // namespace

void BindRuntime(py::module_& m) {
    // Streams are values (a pooled handle and its device); they are never destroyed.
    py::class_<Stream>(m, "Stream")
        .def(py::init([](const std::string& dev) { return StreamFromPool(Dev(dev)); }), py::arg("device"))
        .def_property_readonly("device", [](const Stream& s) { return s.device().ToString(); })
        .def_property_readonly("is_default", &Stream::is_default)
        .def("synchronize",
             [](const Stream& s) {
                 DeviceGuard guard(s.device());
                 py::gil_scoped_release release;
                 GetRuntime(s.device().type).SynchronizeStream(s);
             })
        .def("wait_event",
             [](const Stream& s, const EventHandle& e) {
                 if (e.get().device() != s.device()) {
                     throw std::invalid_argument("event and stream are on different devices");
                 }
                 GetRuntime(s.device().type).StreamWaitEvent(s, e.get());
             })
        .def("wait_stream",
             [](const Stream& s, const Stream& other) {
                 // Work issued on s from now on waits for what other has been given so far (PyTorch's).
                 if (other.device() != s.device()) {
                     throw std::invalid_argument("wait_stream: the streams are on different devices");
                 }
                 EventHandle e(other.device());
                 DeviceRuntime& rt = GetRuntime(s.device().type);
                 rt.RecordEvent(e.get(), other);
                 rt.StreamWaitEvent(s, e.get());
             })
        .def("__eq__", [](const Stream& a, const Stream& b) { return a == b; })
        .def("__hash__", [](const Stream& s) { return std::hash<void*>()(s.handle()) ^ s.device().index; })
        .def("__repr__", &Stream::ToString);
    m.def("default_stream", [](const std::string& dev) { return Stream::Default(Dev(dev)); });
    m.def("set_current_stream", [](const Stream& s) { SetCurrentStream(s); });
    m.def("current_stream", [](const std::string& dev) { return CurrentStream(Dev(dev)); });

    py::class_<EventHandle, std::shared_ptr<EventHandle>>(m, "Event")
        .def(py::init([](const std::string& dev) { return std::make_shared<EventHandle>(Dev(dev)); }),
             py::arg("device"))
        .def_property_readonly("device", [](const EventHandle& e) { return e.get().device().ToString(); })
        .def(
            "record",
            [](const EventHandle& e, std::optional<Stream> s) {
                GetRuntime(e.get().device().type).RecordEvent(e.get(), StreamArg(s, e.get().device()));
            },
            py::arg("stream") = py::none())
        .def("query", [](const EventHandle& e) { return GetRuntime(e.get().device().type).QueryEvent(e.get()); })
        .def("synchronize",
             [](const EventHandle& e) {
                 py::gil_scoped_release release;
                 GetRuntime(e.get().device().type).SynchronizeEvent(e.get());
             })
        .def("elapsed_ms", [](const EventHandle& start, const EventHandle& end) {
            if (start.get().device() != end.get().device()) {
                throw std::invalid_argument("events are on different devices");
            }
            return GetRuntime(start.get().device().type).ElapsedMs(start.get(), end.get());
        });

    m.def("parse_device", [](const std::string& s) { return Dev(s).ToString(); });
    m.def("device_count", [](const std::string& type) {
        Device d = Dev(type);
        return d.is_cpu() ? 1 : GetRuntime(d.type).DeviceCount();
    });
    m.def("current_device", [](const std::string& type) {
        Device d = Dev(type);
        return Device{d.type, CurrentDevice(d.type)}.ToString();
    });
    m.def("set_device", [](const std::string& dev) {
        Device d = Dev(dev);
        CheckDevice(d);
        SetCurrentDevice(d);
    });
    m.def("synchronize", [](const std::string& dev) {
        Device d = Dev(dev);
        if (d.is_cpu()) return;
        CheckDevice(d);
        py::gil_scoped_release release;
        GetRuntime(d.type).SynchronizeDevice(d.index);
    });
    m.def("memory_stats", [](const std::string& dev) { return StatsDict(DeviceAllocator(Dev(dev)).Stats()); });
    m.def("pinned_memory_stats", [] { return StatsDict(PinnedAllocator().Stats()); });
    m.def("reset_peak_memory", [](const std::string& dev) { DeviceAllocator(Dev(dev)).ResetPeak(); });
    m.def("empty_cache", [](const std::string& dev) {
        CachingAllocator& a = DeviceAllocator(Dev(dev));
        py::gil_scoped_release release;
        a.EmptyCache();
    });

    m.def("set_num_threads", &SetCpuThreads);
    m.def("get_num_threads", &CpuThreads);
    m.def("loaded_providers", &LoadedProviders);
    m.def("privateuse1", []() -> py::object {
        const PrivateUse1Info* p = GetPrivateUse1();
        if (!p) return py::none();
        py::dict d;
        d["name"] = p->name;
        d["autocast_dtype"] = DataTypeName(p->autocast_dtype);
        return std::move(d);
    });
}

}  // namespace infinitrain::python
