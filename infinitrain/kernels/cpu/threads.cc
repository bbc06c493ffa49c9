#include <omp.h>

#include <stdexcept>
#include <string>

#include "infinitrain/cpu_threads.h"

namespace infinitrain {

void SetCpuThreads(int n) {
    if (n < 1)
        throw std::invalid_argument("set_num_threads: expected a positive thread count, got " + std::to_string(n));
    omp_set_num_threads(n);
}

int CpuThreads() { return omp_get_max_threads(); }

}  // namespace infinitrain
