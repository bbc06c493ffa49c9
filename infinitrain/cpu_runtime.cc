// The CPU runtime: host memory with statistics; streams and events are
// synchronous (every CPU kernel has finished when its call returns).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include "infinitrain/runtime.h"

namespace infinitrain {
namespace {

class CpuRuntime final : public DeviceRuntime {
public:
    DeviceType type() const override { return DeviceType::kCPU; }
    int DeviceCount() override { return 1; }
    int CurrentDevice() override { return 0; }
    void SetDevice(int index) override {
        if (index != 0) throw std::invalid_argument("cpu has one device, index 0");
    }

    void* Malloc(size_t nbytes, int) override {
        size_t rounded = (nbytes + 63) / 64 * 64;
        void* p = std::aligned_alloc(64, rounded);
        if (!p) throw std::bad_alloc();
        std::lock_guard<std::mutex> lock(mu_);
        sizes_[p] = rounded;
        stats_.allocated += rounded;
        stats_.reserved += rounded;
        stats_.num_allocs += 1;
        if (stats_.allocated > stats_.peak_allocated) stats_.peak_allocated = stats_.allocated;
        return p;
    }
    void Free(void* ptr, int) override {
        if (!ptr) return;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = sizes_.find(ptr);
            if (it != sizes_.end()) {
                stats_.allocated -= it->second;
                stats_.reserved -= it->second;
                sizes_.erase(it);
            }
        }
        std::free(ptr);
    }

    void Memcpy(void* dst, const void* src, size_t n, MemcpyKind, int) override { std::memcpy(dst, src, n); }
    void MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind, int, Stream) override {
        std::memcpy(dst, src, n);
    }
    void Memset(void* ptr, int value, size_t n, int, Stream) override { std::memset(ptr, value, n); }

    Stream CreateStream(int) override { return new int(0); }
    void DestroyStream(Stream s, int) override { delete static_cast<int*>(s); }
    void SynchronizeStream(Stream, int) override {}
    void StreamWaitEvent(Stream, Event, int) override {}

    Event CreateEvent(int) override { return new double(0.0); }
    void DestroyEvent(Event e, int) override { delete static_cast<double*>(e); }
    void RecordEvent(Event e, Stream, int) override {
        using namespace std::chrono;
        *static_cast<double*>(e) = duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
    }
    bool QueryEvent(Event, int) override { return true; }
    void SynchronizeEvent(Event, int) override {}
    float ElapsedMs(Event start, Event end, int) override {
        return static_cast<float>(*static_cast<double*>(end) - *static_cast<double*>(start));
    }

    void SynchronizeDevice(int) override {}
    MemoryStats GetMemoryStats(int) override {
        std::lock_guard<std::mutex> lock(mu_);
        return stats_;
    }
    void ResetPeakMemory(int) override {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.peak_allocated = stats_.allocated;
    }

private:
    std::mutex mu_;
    std::unordered_map<void*, size_t> sizes_;
    MemoryStats stats_;
};

}  // namespace

REGISTER_DEVICE_RUNTIME(DeviceType::kCPU, CpuRuntime);

}  // namespace infinitrain
