// infinitrain._gloo: importing it registers the cpu's CCL on Gloo (infinitrain/gloo/gloo_ccl.cc).
#include <pybind11/pybind11.h>

#include "infinitrain/gloo/gloo_ccl.h"

PYBIND11_MODULE(_gloo, m) {
    m.doc() = "The cpu's collective library on Gloo; importing registers it.";
    m.def("flush_sends", &infinitrain::gloo_ccl::FlushSends, pybind11::call_guard<pybind11::gil_scoped_release>(),
          "Waits until the receivers took this process's pending sends (at exit).");
}
