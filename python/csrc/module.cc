// infinitrain._C: the native core as seen from Python.
#include <pybind11/pybind11.h>

#include "infinitrain/allocator.h"
#include "infinitrain/op.h"
#include "python/csrc/bindings.h"

namespace infinitrain::python {
namespace {

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

}  // namespace

Device Dev(const std::string& spec) { return ParseDevice(spec); }

}  // namespace infinitrain::python

PYBIND11_MODULE(_C, m) {
    using namespace infinitrain;
    namespace py = pybind11;
    m.doc() = "infinitrain native core";
    CheckRegistrations();

    py::register_exception<MissingKernelError>(m, "MissingKernelError", PyExc_NotImplementedError);
    py::register_exception<OutOfMemoryError>(m, "OutOfMemoryError", PyExc_MemoryError);
    SetDeviceResolver(&python::ResolveDevice);
    SetWarningHandler([](const std::string& msg) {
        py::gil_scoped_acquire gil;
        if (PyErr_WarnEx(PyExc_RuntimeWarning, msg.c_str(), 1) < 0) throw py::error_already_set();
    });

    python::BindTensors(m);
    python::BindOps(m);
    python::BindRuntime(m);
    python::BindCollectives(m);
    python::BindStore(m);
}
