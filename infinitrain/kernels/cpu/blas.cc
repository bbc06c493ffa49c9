// Makes OpenBLAS single-threaded for the whole process (see blas.h for why).
#include <scipy_openblas/cblas.h>

namespace infinitrain::cpu {
namespace {
const bool kBlasSingleThreaded = [] {
    scipy_openblas_set_num_threads(1);
    return true;
}();
}  // namespace
}  // namespace infinitrain::cpu
