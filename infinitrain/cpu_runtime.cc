// The CPU runtime and the host-memory runtime it is made of.
#include <chrono>
#include <cstdlib>
#include <cstring>
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

void* HostMemoryRuntime::RawAlloc(size_t nbytes, int) {
    size_t rounded = (nbytes + 63) / 64 * 64;
    if (rounded < nbytes) return nullptr;
    return std::aligned_alloc(64, rounded ? rounded : 64);
}

void HostMemoryRuntime::RawFree(void* ptr, int) { std::free(ptr); }

void HostMemoryRuntime::MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind, const Stream&) {
    if (n) std::memmove(dst, src, n);
}

void HostMemoryRuntime::MemsetAsync(void* ptr, int value, size_t n, const Stream&) {
    if (n) std::memset(ptr, value, n);
}

// Streams are distinct handles that all run work at once.
Stream HostMemoryRuntime::CreateStream(int device) { return Stream(Device{type_, device}, new int(0)); }

Event HostMemoryRuntime::CreateEvent(int device) { return Event(Device{type_, device}, new double(0.0)); }
void HostMemoryRuntime::DestroyEvent(const Event& e) { delete static_cast<double*>(e.handle()); }

void HostMemoryRuntime::RecordEvent(const Event& e, const Stream&) {
    using namespace std::chrono;
    *static_cast<double*>(e.handle()) = duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

float HostMemoryRuntime::ElapsedMs(const Event& start, const Event& end) {
    return static_cast<float>(*static_cast<double*>(end.handle()) - *static_cast<double*>(start.handle()));
}

namespace {
class CpuRuntime final : public HostMemoryRuntime {
public:
    CpuRuntime() : HostMemoryRuntime(DeviceType::kCPU, 1) {}
};
}  // namespace

REGISTER_DEVICE_RUNTIME(DeviceType::kCPU, CpuRuntime);

}  // namespace infinitrain
