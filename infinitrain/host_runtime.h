// A runtime over host memory whose streams and events are synchronous (work
// is done when its call returns). The CPU runtime is one; a provider under
// bring-up can start from it too.
#pragma once

#include "infinitrain/runtime.h"

namespace infinitrain {

class HostMemoryRuntime : public DeviceRuntime {
public:
    HostMemoryRuntime(DeviceType type, int device_count) : type_(type), count_(device_count) {}
    DeviceType type() const override { return type_; }
    int DeviceCount() override { return count_; }
    void SetDevice(int index) override;

    void* RawAlloc(size_t nbytes, int device) override;
    void RawFree(void* ptr, int device) override;
    void MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind kind, const Stream& stream) override;
    void MemsetAsync(void* ptr, int value, size_t n, const Stream& stream) override;

    Stream CreateStream(int device) override;
    void SynchronizeStream(const Stream&) override {}
    void StreamWaitEvent(const Stream&, const Event&) override {}
    Event CreateEvent(int device) override;
    void DestroyEvent(const Event& event) override;
    void RecordEvent(const Event& event, const Stream& stream) override;
    bool QueryEvent(const Event&) override { return true; }
    void SynchronizeEvent(const Event&) override {}
    float ElapsedMs(const Event& start, const Event& end) override;
    void SynchronizeDevice(int) override {}

private:
    DeviceType type_;
    int count_;
};

}  // namespace infinitrain
