// DeviceRuntime: the small virtual interface every device type implements
// (memory, copies, streams, events, statistics). One runtime per device type,
// registered once from file scope and created lazily on first lookup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "infinitrain/device.h"

namespace infinitrain {

using Stream = void*;  // opaque, owned by the runtime; nullptr is the default stream
using Event = void*;

enum class MemcpyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

struct MemoryStats {
    int64_t allocated = 0;       // bytes handed out and not yet freed
    int64_t reserved = 0;        // bytes held from the system, cached blocks included
    int64_t peak_allocated = 0;  // high-water mark of `allocated` since the last reset
    int64_t num_allocs = 0;
};

class DeviceRuntime {
public:
    virtual ~DeviceRuntime() = default;
    virtual DeviceType type() const = 0;

    virtual int DeviceCount() = 0;
    virtual int CurrentDevice() = 0;
    virtual void SetDevice(int index) = 0;

    virtual void* Malloc(size_t nbytes, int device) = 0;
    virtual void Free(void* ptr, int device) = 0;
    // Stream-ordered: the block is usable by work on `stream` and returns to the cache when that work is done.
    virtual void* MallocAsync(size_t nbytes, int device, Stream stream) { return Malloc(nbytes, device); }
    virtual void FreeAsync(void* ptr, int device, Stream stream) { Free(ptr, device); }

    virtual void Memcpy(void* dst, const void* src, size_t nbytes, MemcpyKind kind, int device) = 0;
    virtual void MemcpyAsync(void* dst, const void* src, size_t nbytes, MemcpyKind kind, int device, Stream stream) = 0;
    virtual void Memset(void* ptr, int value, size_t nbytes, int device, Stream stream) = 0;

    virtual Stream CreateStream(int device) = 0;
    virtual void DestroyStream(Stream stream, int device) = 0;
    virtual void SynchronizeStream(Stream stream, int device) = 0;
    virtual void StreamWaitEvent(Stream stream, Event event, int device) = 0;

    virtual Event CreateEvent(int device) = 0;
    virtual void DestroyEvent(Event event, int device) = 0;
    virtual void RecordEvent(Event event, Stream stream, int device) = 0;
    virtual bool QueryEvent(Event event, int device) = 0;
    virtual void SynchronizeEvent(Event event, int device) = 0;
    virtual float ElapsedMs(Event start, Event end, int device) = 0;

    virtual void SynchronizeDevice(int device) = 0;
    virtual MemoryStats GetMemoryStats(int device) = 0;
    virtual void ResetPeakMemory(int device) = 0;
    // Vendor BLAS handle for `device`, or nullptr where the device has none.
    virtual void* BlasHandle(int device) { return nullptr; }
};

using RuntimeFactory = std::function<std::unique_ptr<DeviceRuntime>()>;

// The stream kernels on `device` go to from the calling thread (nullptr: the default stream).
Stream CurrentStream(const Device& device);
void SetCurrentStream(const Device& device, Stream stream);

// Registers the factory for a device type; a second registration for the same type raises.
void RegisterRuntime(DeviceType type, RuntimeFactory factory, const char* site);
// Creates the runtime on first use. Raises std::runtime_error when none is registered.
DeviceRuntime& GetRuntime(DeviceType type);
bool HasRuntime(DeviceType type);

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
