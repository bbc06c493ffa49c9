// The pieces of infinitrain._C, one file per area: tensors, ops, runtime
// (devices, streams, events, memory), collectives, the rendezvous store. module.cc puts them together.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "infinitrain/device.h"

namespace infinitrain::python {

namespace py = pybind11;

void BindTensors(py::module_& m);
void BindOps(py::module_& m);
void BindRuntime(py::module_& m);
void BindCollectives(py::module_& m);
void BindStore(py::module_& m);

// Parses a device name; an unknown provider name imports and registers that provider first.
Device Dev(const std::string& spec);

}  // namespace infinitrain::python
