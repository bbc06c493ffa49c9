// Throwaway CUDA runtime for kernel testing only (synchronous malloc/free).
#include "infinitrain/runtime.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "infinitrain/provider.h"

namespace infinitrain::gpu {
void RaisePendingDeviceError(int device);
}

namespace {
using namespace infinitrain;

void Ck(cudaError_t e, const char* w) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(w) + ": " + cudaGetErrorString(e));
}
cudaMemcpyKind Kind(MemcpyKind k) {
    switch (k) {
        case MemcpyKind::kHostToDevice:
            return cudaMemcpyHostToDevice;
        case MemcpyKind::kDeviceToHost:
            return cudaMemcpyDeviceToHost;
        default:
            return cudaMemcpyDeviceToDevice;
    }
}

class TestRuntime : public DeviceRuntime {
public:
    DeviceType type() const override { return DeviceType::kPrivateUse1; }
    int DeviceCount() override {
        int n = 0;
        Ck(cudaGetDeviceCount(&n), "count");
        return n;
    }
    int CurrentDevice() override {
        int d;
        Ck(cudaGetDevice(&d), "getdev");
        return d;
    }
    void SetDevice(int i) override { Ck(cudaSetDevice(i), "setdev"); }
    void* Malloc(size_t n, int) override {
        void* p;
        Ck(cudaMalloc(&p, n ? n : 1), "malloc");
        return p;
    }
    void Free(void* p, int) override { Ck(cudaFree(p), "free"); }
    void Memcpy(void* d, const void* s, size_t n, MemcpyKind k, int) override {
        Ck(cudaMemcpy(d, s, n, Kind(k)), "memcpy");
    }
    void MemcpyAsync(void* d, const void* s, size_t n, MemcpyKind k, int, Stream st) override {
        Ck(cudaMemcpyAsync(d, s, n, Kind(k), (cudaStream_t)st), "memcpyasync");
    }
    void Memset(void* p, int v, size_t n, int, Stream st) override {
        Ck(cudaMemsetAsync(p, v, n, (cudaStream_t)st), "memset");
    }
    Stream CreateStream(int) override {
        cudaStream_t s;
        Ck(cudaStreamCreate(&s), "stream");
        return s;
    }
    void DestroyStream(Stream s, int) override { cudaStreamDestroy((cudaStream_t)s); }
    void SynchronizeStream(Stream s, int d) override {
        Ck(cudaStreamSynchronize((cudaStream_t)s), "sync");
        gpu::RaisePendingDeviceError(d);
    }
    void StreamWaitEvent(Stream s, Event e, int) override { cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0); }
    Event CreateEvent(int) override {
        cudaEvent_t e;
        cudaEventCreate(&e);
        return e;
    }
    void DestroyEvent(Event e, int) override { cudaEventDestroy((cudaEvent_t)e); }
    void RecordEvent(Event e, Stream s, int) override { cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s); }
    bool QueryEvent(Event e, int) override { return cudaEventQuery((cudaEvent_t)e) == cudaSuccess; }
    void SynchronizeEvent(Event e, int) override { cudaEventSynchronize((cudaEvent_t)e); }
    float ElapsedMs(Event a, Event b, int) override {
        float ms = 0;
        cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b);
        return ms;
    }
    void SynchronizeDevice(int d) override {
        Ck(cudaDeviceSynchronize(), "devsync");
        gpu::RaisePendingDeviceError(d);
    }
    MemoryStats GetMemoryStats(int) override { return {}; }
    void ResetPeakMemory(int) override {}
};

}  // namespace

REGISTER_PROVIDER_RUNTIME("cuda", TestRuntime);
