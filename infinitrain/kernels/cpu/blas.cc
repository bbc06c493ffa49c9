// Makes OpenBLAS single-threaded for the whole process (see blas.h for why).
#include <cblas.h>

namespace infinitrain::cpu {
namespace {
const bool kBlasSingleThreaded = [] {
    openblas_set_num_threads(1);
    return true;
}();
}  // namespace
}  // namespace infinitrain::cpu
