// The sim DeviceRuntime: device memory from memory.cc, streams and events
// from streams.cc, copies through the host views. Copies are enqueued on their
// stream; a host-to-device copy from pageable memory is staged at once (like a
// pageable copy on a GPU), one from pinned memory reads its source when it runs.
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/sim/sim.h"
#include "infinitrain/provider.h"

namespace infinitrain::sim {
namespace {

void CheckOwner(int got, const Stream& stream, const void* p) {
    if (got != stream.device().index) {
        throw std::invalid_argument("sim: memory at " + std::to_string(reinterpret_cast<uintptr_t>(p)) +
                                    " belongs to sim:" + std::to_string(got) + ", the copy runs on " +
                                    stream.device().ToString());
    }
}

class SimRuntime final : public DeviceRuntime {
public:
    ~SimRuntime() override { Shutdown(); }

    DeviceType type() const override { return DeviceType::kPrivateUse1; }
    int DeviceCount() override { return sim::DeviceCount(); }
    void SetDevice(int index) override { CheckDeviceIndex(index); }

    void* RawAlloc(size_t nbytes, int device) override { return MapDeviceMemory(nbytes, device); }
    // Like cudaFree and cudaFreeHost: memory goes back only once no queued work can touch it.
    void RawFree(void* ptr, int device) override {
        WaitForDevice(device);
        UnmapDeviceMemory(ptr, device);
    }
    void* HostAlloc(size_t nbytes) override { return AllocPinned(nbytes); }
    void HostFree(void* ptr) override {
        for (int d = 0; d < sim::DeviceCount(); ++d) WaitForDevice(d);
        FreePinned(ptr);
    }

    void MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind kind, const Stream& stream) override {
        if (n == 0) return;
        int dd = -1, sd = -1;
        switch (kind) {
            case MemcpyKind::kHostToDevice: {
                CheckHostPointer(src);
                char* hdst = HostRange(dst, n, &dd);
                CheckOwner(dd, stream, dst);
                if (IsPinned(src)) {
                    Enqueue(stream, [hdst, src, n] { std::memcpy(hdst, src, n); });
                    return;
                }
                auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                                  static_cast<const char*>(src) + n);
                Enqueue(stream, [hdst, staged] { std::memcpy(hdst, staged->data(), staged->size()); });
                return;
            }
            case MemcpyKind::kDeviceToHost: {
                CheckHostPointer(dst);
                const char* hsrc = HostRange(src, n, &sd);
                CheckOwner(sd, stream, src);
                Enqueue(stream, [dst, hsrc, n] { std::memcpy(dst, hsrc, n); });
                return;
            }
            case MemcpyKind::kDeviceToDevice: {
                const char* hsrc = HostRange(src, n, &sd);
                char* hdst = HostRange(dst, n, &dd);
                CheckOwner(sd, stream, src);
                CheckOwner(dd, stream, dst);
                Enqueue(stream, [hdst, hsrc, n] { std::memmove(hdst, hsrc, n); });
                return;
            }
        }
    }

    void MemsetAsync(void* ptr, int value, size_t n, const Stream& stream) override {
        if (n == 0) return;
        int d = -1;
        char* h = HostRange(ptr, n, &d);
        CheckOwner(d, stream, ptr);
        Enqueue(stream, [h, value, n] { std::memset(h, value, n); });
    }

    Stream CreateStream(int device) override { return sim::CreateStream(device); }
    void SynchronizeStream(const Stream& stream) override { sim::SynchronizeStream(stream); }
    void StreamWaitEvent(const Stream& stream, const Event& event) override {
        if (event.device() != stream.device()) {
            throw std::invalid_argument("sim: a stream of " + stream.device().ToString() +
                                        " cannot wait for an event of " + event.device().ToString());
        }
        sim::StreamWaitEvent(stream, event);
    }

    Event CreateEvent(int device) override { return sim::CreateEvent(device); }
    void DestroyEvent(const Event& event) override { sim::DestroyEvent(event); }
    void RecordEvent(const Event& event, const Stream& stream) override { sim::RecordEvent(event, stream); }
    bool QueryEvent(const Event& event) override { return sim::QueryEvent(event); }
    void SynchronizeEvent(const Event& event) override { sim::SynchronizeEvent(event); }
    float ElapsedMs(const Event& start, const Event& end) override { return sim::ElapsedMs(start, end); }

    void SynchronizeDevice(int device) override { sim::SynchronizeDevice(device); }
};

}  // namespace

REGISTER_PROVIDER_RUNTIME(kName, SimRuntime);

}  // namespace infinitrain::sim
