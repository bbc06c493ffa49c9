// The runtime of a CUDA-dialect provider, written once for every vendor
// through the vendor header's GPU_RT / GPU_BLAS names (cudaMalloc or mcMalloc,
// cublasCreate or mcblasCreate): devices, raw memory for the core's caching
// allocator, page-locked host memory, streams, events, copies and BLAS handles.
// After every wait it raises what went wrong: a runtime error, or bad input a
// kernel recorded (an out-of-range index), which becomes a Python exception
// like the cpu's.
//
// INFINITRAIN_GPU_ASYNC_POOL_MB=N takes raw memory from the vendor's
// stream-ordered pool (cudaMallocAsync / mcMallocAsync) with a release
// threshold of N MiB instead of plain allocations; off by default (MACA users
// report the async pool racing with peer mapping in multi-threaded runs).
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/gpu/device_error.h"
#include "backends/gpu/vendor.h"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void Check(RtError e, const char* what) {
    if (e == GPU_RT(Success)) return;
    GPU_RT(GetLastError)();  // clears a non-sticky error so later calls work
    throw std::runtime_error(std::string(kProviderName) + ": " + what + ": " + GPU_RT(GetErrorString)(e));
}

// Makes `device` the runtime's current device for the scope (the runtime is called with explicit indices).
class ScopedDevice {
public:
    explicit ScopedDevice(int device) {
        Check(GPU_RT(GetDevice)(&prev_), "GetDevice");
        if (prev_ != device) Check(GPU_RT(SetDevice)(device), "SetDevice");
        changed_ = prev_ != device;
    }
    ~ScopedDevice() {
        if (changed_) GPU_RT(SetDevice)(prev_);
    }

private:
    int prev_ = 0;
    bool changed_ = false;
};

NativeStream_t Native(const Stream& s) { return static_cast<NativeStream_t>(s.handle()); }
NativeEvent_t Native(const Event& e) { return static_cast<NativeEvent_t>(e.handle()); }

RtMemcpyKind Kind(MemcpyKind k) {
    switch (k) {
        case MemcpyKind::kHostToDevice:
            return GPU_RT(MemcpyHostToDevice);
        case MemcpyKind::kDeviceToHost:
            return GPU_RT(MemcpyDeviceToHost);
        case MemcpyKind::kDeviceToDevice:
            break;
    }
    return GPU_RT(MemcpyDeviceToDevice);
}

// The release threshold of the async pool in bytes, or -1 when plain allocations are used.
int64_t AsyncPoolThreshold() {
    static const int64_t bytes = [] {
        const char* e = std::getenv("INFINITRAIN_GPU_ASYNC_POOL_MB");
        if (!e || !*e) return int64_t{-1};
        char* end = nullptr;
        long long mb = std::strtoll(e, &end, 10);
        if (*end || mb < 0) {
            throw std::invalid_argument(std::string("INFINITRAIN_GPU_ASYNC_POOL_MB='") + e +
                                        "': expected a whole number of MiB (the pool's release threshold)");
        }
        return static_cast<int64_t>(mb) << 20;
    }();
    return bytes;
}

// Waits on `what`, then turns a runtime error or (unless only queried) a kernel's reported error into an exception.
void AfterWait(RtError e, const char* what, int device, bool report_kernel_errors = true) {
    if (e != GPU_RT(Success)) {
        GPU_RT(GetLastError)();
        throw std::runtime_error(std::string(kProviderName) + ":" + std::to_string(device) + ": " + what + ": " +
                                 GPU_RT(GetErrorString)(e) +
                                 " (an asynchronous error from earlier work on the device; set " + kSyncEnv +
                                 "=1 to check every op as it runs and name the one that fails; after a device fault "
                                 "the process must restart)");
    }
    if (!report_kernel_errors) return;
    ScopedDevice guard(device);
    RaisePendingDeviceError(device);
}

class GpuRuntime final : public DeviceRuntime {
public:
    DeviceType type() const override { return DeviceType::kPrivateUse1; }

    int DeviceCount() override {
        std::call_once(count_once_, [this] {
            RtError e = GPU_RT(GetDeviceCount)(&count_);
            if (e != GPU_RT(Success)) {
                GPU_RT(GetLastError)();
                count_error_ = std::string(kProviderName) +
                               ": no usable device (GetDeviceCount: " + GPU_RT(GetErrorString)(e) + ")";
                count_ = 0;
            }
        });
        if (!count_error_.empty()) throw std::runtime_error(count_error_);
        return count_;
    }

    void SetDevice(int index) override { Check(GPU_RT(SetDevice)(index), "SetDevice"); }

    void* RawAlloc(size_t nbytes, int device) override {
        ScopedDevice guard(device);
        void* p = nullptr;
        RtError e;
        if (AsyncPoolThreshold() >= 0) {
            PreparePool(device);
            e = GPU_RT(MallocAsync)(&p, nbytes, nullptr);
            if (e == GPU_RT(Success)) e = GPU_RT(StreamSynchronize)(nullptr);
        } else {
            e = GPU_RT(Malloc)(&p, nbytes);
        }
        if (e == GPU_RT(ErrorMemoryAllocation)) {
            GPU_RT(GetLastError)();
            return nullptr;
        }
        Check(e, "Malloc");
        return p;
    }

    void RawFree(void* ptr, int device) override {
        ScopedDevice guard(device);
        if (AsyncPoolThreshold() >= 0) {
            Check(GPU_RT(DeviceSynchronize)(), "DeviceSynchronize");  // as Free does: no queued work touches it
            Check(GPU_RT(FreeAsync)(ptr, nullptr), "FreeAsync");
            return;
        }
        Check(GPU_RT(Free)(ptr), "Free");  // waits for the device's work, as the contract asks
    }

    void* HostAlloc(size_t nbytes) override {
        void* p = nullptr;
        RtError e = GPU_RT(MallocHost)(&p, nbytes ? nbytes : 1);
        if (e == GPU_RT(ErrorMemoryAllocation)) {
            GPU_RT(GetLastError)();
            return nullptr;
        }
        Check(e, "MallocHost");
        return p;
    }

    void HostFree(void* ptr) override { Check(GPU_RT(FreeHost)(ptr), "FreeHost"); }

    void MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind kind, const Stream& stream) override {
        if (n == 0) return;
        Check(GPU_RT(MemcpyAsync)(dst, src, n, Kind(kind), Native(stream)), "MemcpyAsync");
    }

    void MemsetAsync(void* ptr, int value, size_t n, const Stream& stream) override {
        if (n == 0) return;
        Check(GPU_RT(MemsetAsync)(ptr, value, n, Native(stream)), "MemsetAsync");
    }

    Stream CreateStream(int device) override {
        ScopedDevice guard(device);
        NativeStream_t s = nullptr;
        // The default priority; pooled streams never wait for the legacy default stream.
        Check(GPU_RT(StreamCreateWithPriority)(&s, GPU_RT(StreamNonBlocking), 0), "StreamCreateWithPriority");
        return Stream(Device{DeviceType::kPrivateUse1, device}, s);
    }

    void SynchronizeStream(const Stream& stream) override {
        AfterWait(GPU_RT(StreamSynchronize)(Native(stream)), "StreamSynchronize", stream.device().index);
    }

    void StreamWaitEvent(const Stream& stream, const Event& event) override {
        Check(GPU_RT(StreamWaitEvent)(Native(stream), Native(event), 0), "StreamWaitEvent");
    }

    Event CreateEvent(int device) override {
        ScopedDevice guard(device);
        NativeEvent_t e = nullptr;
        Check(GPU_RT(EventCreateWithFlags)(&e, GPU_RT(EventDefault)), "EventCreate");
        return Event(Device{DeviceType::kPrivateUse1, device}, e);
    }

    void DestroyEvent(const Event& event) override { Check(GPU_RT(EventDestroy)(Native(event)), "EventDestroy"); }

    void RecordEvent(const Event& event, const Stream& stream) override {
        Check(GPU_RT(EventRecord)(Native(event), Native(stream)), "EventRecord");
    }

    bool QueryEvent(const Event& event) override {
        RtError e = GPU_RT(EventQuery)(Native(event));
        if (e == GPU_RT(ErrorNotReady)) {
            GPU_RT(GetLastError)();
            return false;
        }
        // A query is no synchronisation: index errors wait for the next one (the allocator polls its events).
        AfterWait(e, "EventQuery", event.device().index, false);
        return true;
    }

    void SynchronizeEvent(const Event& event) override {
        AfterWait(GPU_RT(EventSynchronize)(Native(event)), "EventSynchronize", event.device().index);
    }

    float ElapsedMs(const Event& start, const Event& end) override {
        float ms = 0;
        Check(GPU_RT(EventElapsedTime)(&ms, Native(start), Native(end)), "EventElapsedTime");
        return ms;
    }

    void SynchronizeDevice(int device) override {
        ScopedDevice guard(device);
        AfterWait(GPU_RT(DeviceSynchronize)(), "DeviceSynchronize", device);
    }

    void* CreateBlasHandle(int device) override {
        ScopedDevice guard(device);
        BlasHandle h = nullptr;
        CheckBlas(GPU_BLAS(Create)(&h), "BLAS Create");
        ConfigureBlasHandle(h);
        return h;
    }

    void DestroyBlasHandle(void* handle, int) override { GPU_BLAS(Destroy)(static_cast<BlasHandle>(handle)); }

    void SetBlasStream(void* handle, const Stream& stream) override {
        CheckBlas(GPU_BLAS(SetStream)(static_cast<BlasHandle>(handle), Native(stream)), "BLAS SetStream");
    }

private:
    // Sets the async pool's release threshold once per device.
    void PreparePool(int device) {
        std::lock_guard<std::mutex> lock(pool_mu_);
        if (device < static_cast<int>(pools_ready_.size()) && pools_ready_[device]) return;
        RtMemPool pool;
        Check(GPU_RT(DeviceGetDefaultMemPool)(&pool, device), "DeviceGetDefaultMemPool");
        uint64_t threshold = static_cast<uint64_t>(AsyncPoolThreshold());
        Check(GPU_RT(MemPoolSetAttribute)(pool, GPU_RT(MemPoolAttrReleaseThreshold), &threshold),
              "MemPoolSetAttribute");
        if (device >= static_cast<int>(pools_ready_.size())) pools_ready_.resize(device + 1, false);
        pools_ready_[device] = true;
    }

    std::mutex pool_mu_;
    std::vector<bool> pools_ready_;
    std::once_flag count_once_;
    int count_ = 0;
    std::string count_error_;
};

}  // namespace

REGISTER_PROVIDER_RUNTIME(kProviderName, GpuRuntime);

}  // namespace infinitrain::gpu
