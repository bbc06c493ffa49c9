// The rendezvous store: infinitrain.distributed's TcpStore (a timeout raises TimeoutError naming the keys, a
// refused token PermissionError).
#include "infinitrain/store.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <optional>

#include "python/csrc/bindings.h"

namespace infinitrain::python {
namespace {

std::chrono::milliseconds Ms(double seconds, const char* what = "timeout") {
    if (!(seconds > 0) || !std::isfinite(seconds) || seconds > 1e9) {
        throw std::invalid_argument(std::string("store: ") + what + " must be positive seconds, got " +
                                    std::to_string(seconds));
    }
    return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000 + 0.5)));
}

size_t Size(const py::handle& v, const std::string& name) {
    int64_t n = v.cast<int64_t>();
    if (n < 1) throw std::invalid_argument("store: limits['" + name + "'] must be positive, got " + std::to_string(n));
    return static_cast<size_t>(n);
}

// limits: a dict overriding some of StoreLimits' fields (sizes in bytes, timeouts in seconds).
StoreLimits Limits(const py::object& given) {
    StoreLimits l;
    if (given.is_none()) return l;
    for (auto [k, v] : given.cast<py::dict>()) {
        std::string name = k.cast<std::string>();
        if (name == "max_key_bytes") {
            l.max_key_bytes = Size(v, name);
        } else if (name == "max_value_bytes") {
            l.max_value_bytes = Size(v, name);
        } else if (name == "max_total_bytes") {
            l.max_total_bytes = Size(v, name);
        } else if (name == "max_buffered_bytes") {
            l.max_buffered_bytes = Size(v, name);
        } else if (name == "max_connections") {
            l.max_connections = static_cast<int>(std::min<size_t>(Size(v, name), 1 << 20));
        } else if (name == "handshake_timeout") {
            l.handshake_timeout = Ms(v.cast<double>(), "limits['handshake_timeout']");
        } else if (name == "stall_timeout") {
            l.stall_timeout = Ms(v.cast<double>(), "limits['stall_timeout']");
        } else {
            throw std::invalid_argument("store: unknown limit '" + name +
                                        "' (max_key_bytes, max_value_bytes, max_total_bytes, max_buffered_bytes, "
                                        "max_connections, handshake_timeout, stall_timeout)");
        }
    }
    return l;
}

py::dict LimitsDict(const StoreLimits& l) {
    py::dict d;
    d["max_key_bytes"] = l.max_key_bytes;
    d["max_value_bytes"] = l.max_value_bytes;
    d["max_total_bytes"] = l.max_total_bytes;
    d["max_buffered_bytes"] = l.max_buffered_bytes;
    d["max_connections"] = l.max_connections > 0 ? l.max_connections : DefaultMaxConnections();
    d["handshake_timeout"] = l.handshake_timeout.count() / 1000.0;
    d["stall_timeout"] = l.stall_timeout.count() / 1000.0;
    return d;
}

}  // namespace

void BindStore(py::module_& m) {
    py::register_exception<StoreTimeout>(m, "StoreTimeout", PyExc_TimeoutError);
    py::register_exception<StoreAuthError>(m, "StoreAuthError", PyExc_PermissionError);
    using G = py::call_guard<py::gil_scoped_release>;
    m.def(
        "store_limits", [] { return LimitsDict(StoreLimits{}); },
        "A server's default limits (TcpStore's limits argument overrides them; max_connections from RLIMIT_NOFILE).");
    py::class_<TcpStore, std::shared_ptr<TcpStore>>(m, "TcpStore")
        .def(py::init([](const std::string& host, int port, bool serve, double timeout,
                         std::optional<std::string> token, const py::object& limits) {
                 StoreLimits l = Limits(limits);
                 auto ms = Ms(timeout);
                 py::gil_scoped_release release;
                 return std::make_shared<TcpStore>(host, port, serve, ms, std::move(token), l);
             }),
             py::arg("host"), py::arg("port"), py::arg("serve") = false, py::arg("timeout") = 300.0, py::kw_only(),
             py::arg("token") = py::none(), py::arg("limits") = py::none())
        .def_property_readonly("host", &TcpStore::host)
        .def_property_readonly("port", &TcpStore::port)
        .def_property_readonly("timeout", [](const TcpStore& s) { return s.timeout().count() / 1000.0; })
        .def_property_readonly("token", &TcpStore::token)
        .def_property_readonly("limits", [](const TcpStore& s) { return LimitsDict(s.limits()); })
        .def("set",
             [](TcpStore& s, const std::string& k, const py::bytes& v) {
                 std::string value = v;
                 py::gil_scoped_release release;
                 s.Set(k, value);
             })
        .def("get",
             [](TcpStore& s, const std::string& k) {
                 std::string v;
                 {
                     py::gil_scoped_release release;
                     v = s.Get(k);
                 }
                 return py::bytes(v);
             })
        .def("add", &TcpStore::Add, G())
        .def("check", &TcpStore::Check, G())
        .def(
            "wait",
            [](TcpStore& s, const std::vector<std::string>& keys, py::object timeout) {
                if (timeout.is_none()) {
                    py::gil_scoped_release release;
                    s.Wait(keys);
                } else {
                    auto ms = Ms(timeout.cast<double>());
                    py::gil_scoped_release release;
                    s.Wait(keys, ms);
                }
            },
            py::arg("keys"), py::arg("timeout") = py::none())
        .def("delete_key", &TcpStore::Delete, G());
}

}  // namespace infinitrain::python
