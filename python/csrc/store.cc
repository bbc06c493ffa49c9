// The rendezvous store: infinitrain.distributed's TcpStore (a timeout raises TimeoutError naming the keys).
#include "infinitrain/store.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <memory>

#include "python/csrc/bindings.h"

namespace infinitrain::python {
namespace {

std::chrono::milliseconds Ms(double seconds) {
    if (!(seconds > 0))
        throw std::invalid_argument("store: timeout must be positive seconds, got " + std::to_string(seconds));
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5));
}

}  // namespace

void BindStore(py::module_& m) {
    py::register_exception<StoreTimeout>(m, "StoreTimeout", PyExc_TimeoutError);
    using G = py::call_guard<py::gil_scoped_release>;
    py::class_<TcpStore, std::shared_ptr<TcpStore>>(m, "TcpStore")
        .def(py::init([](const std::string& host, int port, bool serve, double timeout) {
                 py::gil_scoped_release release;
                 return std::make_shared<TcpStore>(host, port, serve, Ms(timeout));
             }),
             py::arg("host"), py::arg("port"), py::arg("serve") = false, py::arg("timeout") = 300.0)
        .def_property_readonly("host", &TcpStore::host)
        .def_property_readonly("port", &TcpStore::port)
        .def_property_readonly("timeout", [](const TcpStore& s) { return s.timeout().count() / 1000.0; })
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
