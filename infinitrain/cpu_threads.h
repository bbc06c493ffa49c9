// The thread count of the CPU kernels' parallel regions (OpenMP), as PyTorch's set_num_threads: it applies to
// regions the calling thread opens from now on.
#pragma once

namespace infinitrain {

void SetCpuThreads(int n);
int CpuThreads();

}  // namespace infinitrain
