// The CPU runtime and the host-memory runtime it is made of.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "infinitrain/host_runtime.h"

namespace infinitrain {

void HostMemoryRuntime::SetDevice(int index) {
    if (index < 0 || index >= count_) {
        throw std::invalid_argument(DeviceTypeName(type_) + " has " + std::to_string(count_) + " device(s), not " +
                                    std::to_string(index));
    }
}

void* HostMemoryRuntime::Malloc(size_t nbytes, int) {
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded ? rounded : 64);
    if (!p) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = rounded;
    stats_.allocated += rounded;
    stats_.reserved += rounded;
    stats_.num_allocs += 1;
    if (stats_.allocated > stats_.peak_allocated) stats_.peak_allocated = stats_.allocated;
    return p;
}

void HostMemoryRuntime::Free(void* ptr, int) {
    if (!ptr) return;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sizes_.find(ptr);
        if (it == sizes_.end()) throw std::invalid_argument("Free of a pointer this runtime did not allocate");
        stats_.allocated -= it->second;
        stats_.reserved -= it->second;
        sizes_.erase(it);
    }
    std::free(ptr);
}

void HostMemoryRuntime::Memcpy(void* dst, const void* src, size_t n, MemcpyKind, int) { std::memcpy(dst, src, n); }

void HostMemoryRuntime::MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind, int, Stream) {
    std::memcpy(dst, src, n);
}

void HostMemoryRuntime::Memset(void* ptr, int value, size_t n, int, Stream) { std::memset(ptr, value, n); }

Stream HostMemoryRuntime::CreateStream(int) { return new int(0); }
void HostMemoryRuntime::DestroyStream(Stream s, int) { delete static_cast<int*>(s); }
Event HostMemoryRuntime::CreateEvent(int) { return new double(0.0); }
void HostMemoryRuntime::DestroyEvent(Event e, int) { delete static_cast<double*>(e); }

void HostMemoryRuntime::RecordEvent(Event e, Stream, int) {
    using namespace std::chrono;
    *static_cast<double*>(e) = duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

float HostMemoryRuntime::ElapsedMs(Event start, Event end, int) {
    return static_cast<float>(*static_cast<double*>(end) - *static_cast<double*>(start));
}

MemoryStats HostMemoryRuntime::GetMemoryStats(int) {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

void HostMemoryRuntime::ResetPeakMemory(int) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated = stats_.allocated;
}

namespace {
class CpuRuntime final : public HostMemoryRuntime {
public:
    CpuRuntime() : HostMemoryRuntime(DeviceType::kCPU, 1) {}
};
}  // namespace

REGISTER_DEVICE_RUNTIME(DeviceType::kCPU, CpuRuntime);

}  // namespace infinitrain
