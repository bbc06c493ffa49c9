// DeviceRuntime: the small virtual interface every device type implements.
// A runtime supplies raw memory, copies, streams and events; the core builds
// everything else on top (the caching allocator in allocator.h, the current
// device and stream per thread, BLAS handle caching). One runtime per device
// type, registered once from file scope and created lazily on first lookup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "infinitrain/device.h"
#include "infinitrain/stream.h"

namespace infinitrain {

enum class MemcpyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class DeviceRuntime {
public:
    virtual ~DeviceRuntime() = default;
    virtual DeviceType type() const = 0;

    virtual int DeviceCount() = 0;
    // Makes `index` the calling thread's current device (kernels launch there). The core calls it only
    // when the thread's device changes; see DeviceGuard.
    virtual void SetDevice(int index) = 0;

    // Raw device memory for the core's caching allocator: returns nullptr when the device is out of
    // memory (the allocator then frees its cache and retries). Other failures raise. RawFree returns the
    // memory only once no queued work can touch it (it waits for the device, as cudaFree does).
    virtual void* RawAlloc(size_t nbytes, int device) = 0;
    virtual void RawFree(void* ptr, int device) = 0;
    // Page-locked host memory that copies can read or write while the host goes on; nullptr when out
    // of memory. HostFree waits for queued copies, as RawFree does. The default is plain host memory
    // (the runtime then stages such copies like any other).
    virtual void* HostAlloc(size_t nbytes);
    virtual void HostFree(void* ptr);

    // Enqueues a copy on `stream` (of the device that owns the device-side pointer). A host source that
    // is not HostAlloc memory may be reused as soon as the call returns (the runtime stages it); a
    // HostAlloc source or any host destination is read or written when the copy runs.
    virtual void MemcpyAsync(void* dst, const void* src, size_t nbytes, MemcpyKind kind, const Stream& stream) = 0;
    virtual void MemsetAsync(void* ptr, int value, size_t nbytes, const Stream& stream) = 0;

    // A new stream; the core keeps the streams it makes for the process (StreamFromPool).
    virtual Stream CreateStream(int device) = 0;
    // Returns when everything enqueued on the stream ran; raises the device's pending asynchronous error.
    virtual void SynchronizeStream(const Stream& stream) = 0;
    // Work enqueued on `stream` later waits until `event`'s latest record completed.
    virtual void StreamWaitEvent(const Stream& stream, const Event& event) = 0;

    virtual Event CreateEvent(int device) = 0;
    virtual void DestroyEvent(const Event& event) = 0;
    virtual void RecordEvent(const Event& event, const Stream& stream) = 0;
    // True when the latest record ran (or the event was never recorded).
    virtual bool QueryEvent(const Event& event) = 0;
    virtual void SynchronizeEvent(const Event& event) = 0;
    virtual float ElapsedMs(const Event& start, const Event& end) = 0;

    // Waits for every stream of the device; raises its pending asynchronous error.
    virtual void SynchronizeDevice(int device) = 0;

    // The vendor BLAS, for devices that have one. The core keeps one handle per (device, thread)
    // (BlasHandle below) and binds it to the op's stream before each use.
    virtual void* CreateBlasHandle(int device) { return nullptr; }
    virtual void DestroyBlasHandle(void* handle, int device) {}
    virtual void SetBlasStream(void* handle, const Stream& stream) {}
};

using RuntimeFactory = std::function<std::unique_ptr<DeviceRuntime>()>;

// Registers the factory for a device type; a second registration for the same type raises.
void RegisterRuntime(DeviceType type, RuntimeFactory factory, const char* site);
// Creates the runtime on first use. Raises std::runtime_error when none is registered.
DeviceRuntime& GetRuntime(DeviceType type);
bool HasRuntime(DeviceType type);
// Raises std::invalid_argument unless `device` exists (cpu:0, or an index below the type's count).
void CheckDevice(const Device& device);

// ---- per-thread state: the current device of each type and the current stream of each device ----

// The calling thread's current device of `type` (index 0 until set).
int CurrentDevice(DeviceType type);
void SetCurrentDevice(const Device& device);
// The stream kernels on `device` go to from the calling thread (its default stream until set).
Stream CurrentStream(const Device& device);
void SetCurrentStream(const Stream& stream);

// Makes `device` current for the guard's lifetime (the runtime's SetDevice runs only on a change).
class DeviceGuard {
public:
    explicit DeviceGuard(const Device& device);
    ~DeviceGuard();
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
    DeviceType type_;
    int prev_;
    bool changed_;
};

// Makes `stream` current for its device, and that device current, for the guard's lifetime.
class StreamGuard {
public:
    explicit StreamGuard(const Stream& stream);
    ~StreamGuard();
    StreamGuard(const StreamGuard&) = delete;
    StreamGuard& operator=(const StreamGuard&) = delete;

private:
    DeviceGuard device_;
    Stream prev_;
};

// The calling thread's BLAS handle for the stream's device, bound to `stream`; nullptr where the
// device type has no BLAS. Handles are made once per (device, thread) and reused by later threads.
void* BlasHandle(const Stream& stream);

// A stream of `device` from the core's pool: up to 32 per device, created on first use and handed out
// in turn, never destroyed (so a stream that memory or a collective still refers to stays valid).
Stream StreamFromPool(const Device& device);

// An event created through the runtime and destroyed with this object.
class OwnedEvent {
public:
    explicit OwnedEvent(const Device& device);
    ~OwnedEvent();
    OwnedEvent(const OwnedEvent&) = delete;
    OwnedEvent& operator=(const OwnedEvent&) = delete;
    const Event& get() const { return event_; }

private:
    Event event_;
};

struct RuntimeRegistrar {
    RuntimeRegistrar(DeviceType type, RuntimeFactory factory, const char* site) {
        RegisterRuntime(type, std::move(factory), site);
    }
};

#define INFINITRAIN_STR2(x) #x
#define INFINITRAIN_STR(x) INFINITRAIN_STR2(x)
#define INFINITRAIN_CONCAT2(a, b) a##b
#define INFINITRAIN_CONCAT(a, b) INFINITRAIN_CONCAT2(a, b)

#define REGISTER_DEVICE_RUNTIME(type, cls)                                                   \
    static ::infinitrain::RuntimeRegistrar INFINITRAIN_CONCAT(runtime_registrar_, __LINE__)( \
        type, [] { return std::unique_ptr<::infinitrain::DeviceRuntime>(new cls()); },       \
        __FILE__ ":" INFINITRAIN_STR(__LINE__))

}  // namespace infinitrain
