// A runtime over host memory with statistics, whose streams and events are
// synchronous (work is done when its call returns). The CPU runtime is one;
// a provider under bring-up can start from it too.
#pragma once

#include <mutex>
#include <unordered_map>

#include "infinitrain/runtime.h"

namespace infinitrain {

class HostMemoryRuntime : public DeviceRuntime {
public:
    HostMemoryRuntime(DeviceType type, int device_count) : type_(type), count_(device_count) {}
    DeviceType type() const override { return type_; }
    int DeviceCount() override { return count_; }
    int CurrentDevice() override { return 0; }
    void SetDevice(int index) override;

    void* Malloc(size_t nbytes, int device) override;
    void Free(void* ptr, int device) override;
    void Memcpy(void* dst, const void* src, size_t n, MemcpyKind kind, int device) override;
    void MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind kind, int device, Stream stream) override;
    void Memset(void* ptr, int value, size_t n, int device, Stream stream) override;

    Stream CreateStream(int device) override;
    void DestroyStream(Stream stream, int device) override;
    void SynchronizeStream(Stream, int) override {}
    void StreamWaitEvent(Stream, Event, int) override {}
    Event CreateEvent(int device) override;
    void DestroyEvent(Event event, int device) override;
    void RecordEvent(Event event, Stream stream, int device) override;
    bool QueryEvent(Event, int) override { return true; }
    void SynchronizeEvent(Event, int) override {}
    float ElapsedMs(Event start, Event end, int device) override;

    void SynchronizeDevice(int) override {}
    MemoryStats GetMemoryStats(int device) override;
    void ResetPeakMemory(int device) override;

private:
    DeviceType type_;
    int count_;
    std::mutex mu_;
    std::unordered_map<void*, size_t> sizes_;
    MemoryStats stats_;  // shared by all devices of the type
};

}  // namespace infinitrain
