// infinitrain_sim: the sim provider's Python module. Importing it only loads
// the library (whose runtime, kernels and CCL wait under the name "sim");
// register_backend() makes them live in the PrivateUse1 slot.
#include <pybind11/pybind11.h>

#include "backends/sim/sim.h"
#include "infinitrain/provider.h"

namespace py = pybind11;

PYBIND11_MODULE(infinitrain_sim, m) {
    m.doc() = "infinitrain sim provider: simulated accelerators on the host";
    m.def(
        "register_backend",
        [] {
            infinitrain::RegisterProvider({infinitrain::sim::kName, infinitrain::DataType::kBFloat16});
        },
        "Claims the PrivateUse1 slot for 'sim' (idempotent).");
    m.def(
        "device_count", [] { return infinitrain::sim::DeviceCount(); },
        "Number of sim devices (INFINITRAIN_SIM_DEVICES, default 4).");
    m.def(
        "memory_capacity", [] { return infinitrain::sim::Capacity(); },
        "Bytes of device memory each sim device may map (INFINITRAIN_SIM_MEMORY; default: physical memory / "
        "device count, at most 16 GiB).");
}
