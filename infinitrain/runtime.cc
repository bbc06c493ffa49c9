#include "infinitrain/runtime.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "infinitrain/type_registry.h"

namespace infinitrain {
namespace {

PerDeviceType<DeviceRuntime>& Runtimes() {
    // Destroyed at exit, so runtimes get to stop their threads.
    static PerDeviceType<DeviceRuntime> r("device runtime", "no device runtime registered for '%s'");
    return r;
}

// Per thread: the current device of each type, and each device's current stream (default until set).
struct ThreadState {
    int device[kNumDeviceTypes] = {};
    std::vector<void*> stream[kNumDeviceTypes];
};
thread_local ThreadState t_state;

}  // namespace

std::string Stream::ToString() const {
    if (is_default()) return "Stream(" + device_.ToString() + ", default)";
    return "Stream(" + device_.ToString() + ", " + std::to_string(reinterpret_cast<uintptr_t>(handle_)) + ")";
}

void* DeviceRuntime::HostAlloc(size_t nbytes) { return std::malloc(nbytes ? nbytes : 1); }
void DeviceRuntime::HostFree(void* ptr) { std::free(ptr); }

void RegisterRuntime(DeviceType type, RuntimeFactory factory, const char* site) {
    Runtimes().Register(type, std::move(factory), site);
}

bool HasRuntime(DeviceType type) { return Runtimes().Has(type); }

DeviceRuntime& GetRuntime(DeviceType type) { return Runtimes().Get(type); }

void CheckDevice(const Device& device) {
    if (device.index < 0) throw std::invalid_argument("device index must be >= 0, got " + device.ToString());
    int count = device.is_cpu() ? 1 : GetRuntime(device.type).DeviceCount();
    if (device.index >= count) {
        throw std::invalid_argument("device " + device.ToString() + " does not exist: " + DeviceTypeName(device.type) +
                                    " has " + std::to_string(count) + " device(s)");
    }
}

int CurrentDevice(DeviceType type) { return t_state.device[static_cast<int>(type)]; }

void SetCurrentDevice(const Device& device) {
    int& cur = t_state.device[static_cast<int>(device.type)];
    if (cur == device.index) return;
    if (!device.is_cpu()) GetRuntime(device.type).SetDevice(device.index);
    cur = device.index;
}

Stream CurrentStream(const Device& device) {
    const auto& v = t_state.stream[static_cast<int>(device.type)];
    return Stream(device, device.index < static_cast<int>(v.size()) ? v[device.index] : nullptr);
}

void SetCurrentStream(const Stream& stream) {
    const Device& d = stream.device();
    auto& v = t_state.stream[static_cast<int>(d.type)];
    if (d.index >= static_cast<int>(v.size())) v.resize(d.index + 1, nullptr);
    v[d.index] = stream.handle();
}

DeviceGuard::DeviceGuard(const Device& device) : type_(device.type), prev_(CurrentDevice(device.type)) {
    changed_ = prev_ != device.index;
    if (changed_) SetCurrentDevice(device);
}

DeviceGuard::~DeviceGuard() {
    if (!changed_) return;
    try {
        SetCurrentDevice(Device{type_, prev_});
    } catch (...) {
        // Restoring a device that worked before cannot fail in practice; never throw from a destructor.
    }
}

StreamGuard::StreamGuard(const Stream& stream) : device_(stream.device()), prev_(CurrentStream(stream.device())) {
    SetCurrentStream(stream);
}

StreamGuard::~StreamGuard() { SetCurrentStream(prev_); }

// ---- BLAS handles ----

namespace {

// Handles of threads that ended, per device, ready for the next thread. Leaked: threads may end after
// static destruction began.
struct BlasPool {
    std::mutex mu;
    std::vector<std::pair<Device, void*>> free;
};
BlasPool& Pool() {
    static BlasPool* p = new BlasPool();
    return *p;
}

struct ThreadBlas {
    struct Entry {
        Device device;
        void* handle;
        Stream bound;
    };
    std::vector<Entry> entries;
    ~ThreadBlas() {
        BlasPool& p = Pool();
        std::lock_guard<std::mutex> lock(p.mu);
        for (const Entry& e : entries) p.free.emplace_back(e.device, e.handle);
    }
};
thread_local ThreadBlas t_blas;

}  // namespace

void* BlasHandle(const Stream& stream) {
    const Device& d = stream.device();
    for (auto& e : t_blas.entries) {
        if (e.device == d) {
            if (e.bound != stream) {
                GetRuntime(d.type).SetBlasStream(e.handle, stream);
                e.bound = stream;
            }
            return e.handle;
        }
    }
    void* handle = nullptr;
    {
        BlasPool& p = Pool();
        std::lock_guard<std::mutex> lock(p.mu);
        for (auto it = p.free.begin(); it != p.free.end(); ++it) {
            if (it->first == d) {
                handle = it->second;
                p.free.erase(it);
                break;
            }
        }
    }
    DeviceRuntime& rt = GetRuntime(d.type);
    if (!handle) {
        DeviceGuard guard(d);
        handle = rt.CreateBlasHandle(d.index);
        if (!handle) return nullptr;
    }
    rt.SetBlasStream(handle, stream);
    t_blas.entries.push_back({d, handle, stream});
    return handle;
}

// ---- owned handles ----

namespace {
constexpr int kStreamsPerDevice = 32;
struct StreamPool {
    std::mutex mu;
    std::map<std::pair<int, int>, std::pair<std::vector<Stream>, size_t>> by_device;  // streams, next
};
StreamPool& Streams() {
    static StreamPool* p = new StreamPool();  // leaked: streams live for the process
    return *p;
}
}  // namespace

Stream StreamFromPool(const Device& device) {
    CheckDevice(device);
    StreamPool& p = Streams();
    std::lock_guard<std::mutex> lock(p.mu);
    auto& [streams, next] = p.by_device[{static_cast<int>(device.type), device.index}];
    if (streams.size() < kStreamsPerDevice) {
        DeviceGuard guard(device);
        streams.push_back(GetRuntime(device.type).CreateStream(device.index));
        return streams.back();
    }
    return streams[next++ % kStreamsPerDevice];
}

OwnedEvent::OwnedEvent(const Device& device) : event_(GetRuntime(device.type).CreateEvent(device.index)) {}

OwnedEvent::~OwnedEvent() {
    try {
        GetRuntime(event_.device().type).DestroyEvent(event_);
    } catch (...) {
    }
}

}  // namespace infinitrain
