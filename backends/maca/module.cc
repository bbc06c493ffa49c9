// infinitrain_maca: the maca provider's Python module. Importing it only loads
// the library (whose runtime, kernels and CCL wait under the name "maca");
// register_backend() makes them live in the PrivateUse1 slot.
#include <pybind11/pybind11.h>

#include "backends/maca/maca.h"

PYBIND11_MODULE(infinitrain_maca, m) {
    m.doc() = "infinitrain maca provider: MetaX GPUs through the MACA runtime, mcBLAS and MCCL";
    m.def("register_backend", &infinitrain::maca::RegisterBackend,
          "Claims the PrivateUse1 slot for 'maca' (idempotent).");
}
