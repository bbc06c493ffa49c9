// Per-op timing. While profiling is on, the dispatcher records for every
// kernel it runs: the op, the device, when the host issued it and how long
// that took, and a pair of device events around the launch, which give the
// kernel's device time once they completed.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "infinitrain/stream.h"

namespace infinitrain {

class Op;

struct OpTiming {
    std::string op;
    Device device;
    double host_start_us;    // since profiling started
    double host_us;          // issuing the kernel: output allocation and launch
    double device_start_ms;  // since the device's first recorded op (-1 for the cpu)
    double device_ms;        // between the events around the launch (the host time, on the cpu)
};

namespace profiler_detail {
extern std::atomic<bool> g_active;
}

inline bool ProfilingActive() { return profiler_detail::g_active.load(std::memory_order_relaxed); }
void StartProfiling();
// Waits for the recorded events and returns the records, in issue order; profiling stops.
std::vector<OpTiming> StopProfiling();

// Times one kernel launch (the dispatcher's): events on `stream` around the scope.
class KernelTimer {
public:
    KernelTimer(const Op* op, const Stream& stream);
    ~KernelTimer();
    KernelTimer(const KernelTimer&) = delete;
    KernelTimer& operator=(const KernelTimer&) = delete;

private:
    const Op* op_;
    Stream stream_;
    double host_start_us_;
    Event start_, end_;
};

}  // namespace infinitrain
