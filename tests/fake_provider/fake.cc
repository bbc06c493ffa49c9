// A minimal provider for the mechanism's own tests: host memory, synchronous
// streams, and kernels for only a few ops (the CPU's, called directly), so the
// tests can see a provider with missing ops, the CPU fallback and composites,
// and two different providers in one process. PROVIDER_NAME comes from the
// build (fake, fake2).
#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>

#include "infinitrain/provider.h"

#define STR2(x) #x
#define STR(x) STR2(x)

namespace {

using namespace infinitrain;

constexpr const char* kName = STR(PROVIDER_NAME);

class FakeRuntime final : public DeviceRuntime {
public:
    DeviceType type() const override { return DeviceType::kPrivateUse1; }
    int DeviceCount() override { return 2; }
    int CurrentDevice() override { return 0; }
    void SetDevice(int) override {}
    void* Malloc(size_t n, int) override {
        void* p = std::malloc(n);
        if (!p) throw std::bad_alloc();
        std::lock_guard<std::mutex> lock(mu_);
        sizes_[p] = n;
        stats_.allocated += n;
        stats_.reserved += n;
        stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
        ++stats_.num_allocs;
        return p;
    }
    void Free(void* p, int) override {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.allocated -= sizes_[p];
        stats_.reserved -= sizes_[p];
        sizes_.erase(p);
        std::free(p);
    }
    void Memcpy(void* d, const void* s, size_t n, MemcpyKind, int) override { std::memcpy(d, s, n); }
    void MemcpyAsync(void* d, const void* s, size_t n, MemcpyKind, int, Stream) override { std::memcpy(d, s, n); }
    void Memset(void* p, int v, size_t n, int, Stream) override { std::memset(p, v, n); }
    Stream CreateStream(int) override { return new int(0); }
    void DestroyStream(Stream s, int) override { delete static_cast<int*>(s); }
    void SynchronizeStream(Stream, int) override {}
    void StreamWaitEvent(Stream, Event, int) override {}
    Event CreateEvent(int) override { return new double(0); }
    void DestroyEvent(Event e, int) override { delete static_cast<double*>(e); }
    void RecordEvent(Event e, Stream, int) override {
        *static_cast<double*>(e) =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }
    bool QueryEvent(Event, int) override { return true; }
    void SynchronizeEvent(Event, int) override {}
    float ElapsedMs(Event a, Event b, int) override {
        return static_cast<float>(*static_cast<double*>(b) - *static_cast<double*>(a));
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

// Device memory is host memory here, so the CPU kernel can run on the same context.
void CpuKernel(KernelContext& ctx) { ctx.op->Kernel(DeviceType::kCPU)(ctx); }

}  // namespace

REGISTER_PROVIDER_RUNTIME(kName, FakeRuntime);
// Enough to create tensors, run elementwise arithmetic and compose silu; nothing else.
REGISTER_PROVIDER_KERNEL(kName, "fill_", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "cast", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "add", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "mul", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "sigmoid", CpuKernel);

PYBIND11_MODULE(MODULE_NAME, m) {
    m.def("register_backend", [] { RegisterProvider({kName, DataType::kFloat16, {"test-only"}}); });
}
