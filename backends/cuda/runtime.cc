// The CUDA runtime: devices, raw memory for the core's caching allocator
// (cudaMalloc), page-locked host memory (cudaHostAlloc), streams, events,
// copies and cuBLAS handles. After every wait it raises what went wrong: a
// CUDA error, or bad input a kernel recorded (an out-of-range index), which
// becomes a Python exception like the cpu's.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda.h"
#include "infinitrain/provider.h"

namespace infinitrain::cuda {

void Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    cudaGetLastError();  // clears a non-sticky error so later calls work
    throw std::runtime_error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

namespace {

// Makes `device` CUDA's current device for the scope (the runtime is called with explicit indices).
class ScopedDevice {
public:
    explicit ScopedDevice(int device) {
        Check(cudaGetDevice(&prev_), "cudaGetDevice");
        if (prev_ != device) Check(cudaSetDevice(device), "cudaSetDevice");
        changed_ = prev_ != device;
    }
    ~ScopedDevice() {
        if (changed_) cudaSetDevice(prev_);
    }

private:
    int prev_ = 0;
    bool changed_ = false;
};

cudaStream_t Native(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }
cudaEvent_t Native(const Event& e) { return static_cast<cudaEvent_t>(e.handle()); }

cudaMemcpyKind Kind(MemcpyKind k) {
    switch (k) {
        case MemcpyKind::kHostToDevice:
            return cudaMemcpyHostToDevice;
        case MemcpyKind::kDeviceToHost:
            return cudaMemcpyDeviceToHost;
        case MemcpyKind::kDeviceToDevice:
            return cudaMemcpyDeviceToDevice;
    }
    return cudaMemcpyDefault;
}

// Waits on `what`, then turns a CUDA error or a kernel's reported error into an exception.
void AfterWait(cudaError_t e, const char* what, int device) {
    if (e != cudaSuccess) {
        cudaGetLastError();
        throw std::runtime_error(std::string("cuda:") + std::to_string(device) + ": " + what + ": " +
                                 cudaGetErrorString(e) +
                                 " (an asynchronous error from earlier work on the device; set "
                                 "INFINITRAIN_CUDA_SYNC=1 to check every op as it runs and name the one that "
                                 "fails; after a device fault the process must restart)");
    }
    ScopedDevice guard(device);
    gpu::RaisePendingDeviceError(device);
}

class CudaRuntime final : public DeviceRuntime {
public:
    DeviceType type() const override { return DeviceType::kPrivateUse1; }

    int DeviceCount() override {
        std::call_once(count_once_, [this] {
            cudaError_t e = cudaGetDeviceCount(&count_);
            if (e != cudaSuccess) {
                cudaGetLastError();
                count_error_ =
                    std::string("cuda: no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
                count_ = 0;
            }
        });
        if (!count_error_.empty()) throw std::runtime_error(count_error_);
        return count_;
    }

    void SetDevice(int index) override { Check(cudaSetDevice(index), "cudaSetDevice"); }

    void* RawAlloc(size_t nbytes, int device) override {
        ScopedDevice guard(device);
        void* p = nullptr;
        cudaError_t e = cudaMalloc(&p, nbytes);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            return nullptr;
        }
        Check(e, "cudaMalloc");
        return p;
    }

    void RawFree(void* ptr, int device) override {
        ScopedDevice guard(device);
        Check(cudaFree(ptr), "cudaFree");  // waits for the device's work, as the contract asks
    }

    void* HostAlloc(size_t nbytes) override {
        void* p = nullptr;
        cudaError_t e = cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocPortable);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            return nullptr;
        }
        Check(e, "cudaHostAlloc");
        return p;
    }

    void HostFree(void* ptr) override { Check(cudaFreeHost(ptr), "cudaFreeHost"); }

    void MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind kind, const Stream& stream) override {
        if (n == 0) return;
        Check(cudaMemcpyAsync(dst, src, n, Kind(kind), Native(stream)), "cudaMemcpyAsync");
    }

    void MemsetAsync(void* ptr, int value, size_t n, const Stream& stream) override {
        if (n == 0) return;
        Check(cudaMemsetAsync(ptr, value, n, Native(stream)), "cudaMemsetAsync");
    }

    Stream CreateStream(int device) override {
        ScopedDevice guard(device);
        cudaStream_t s = nullptr;
        Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
        return Stream(Device{DeviceType::kPrivateUse1, device}, s);
    }

    void SynchronizeStream(const Stream& stream) override {
        AfterWait(cudaStreamSynchronize(Native(stream)), "cudaStreamSynchronize", stream.device().index);
    }

    void StreamWaitEvent(const Stream& stream, const Event& event) override {
        Check(cudaStreamWaitEvent(Native(stream), Native(event), 0), "cudaStreamWaitEvent");
    }

    Event CreateEvent(int device) override {
        ScopedDevice guard(device);
        cudaEvent_t e = nullptr;
        Check(cudaEventCreate(&e), "cudaEventCreate");
        return Event(Device{DeviceType::kPrivateUse1, device}, e);
    }

    void DestroyEvent(const Event& event) override { Check(cudaEventDestroy(Native(event)), "cudaEventDestroy"); }

    void RecordEvent(const Event& event, const Stream& stream) override {
        Check(cudaEventRecord(Native(event), Native(stream)), "cudaEventRecord");
    }

    bool QueryEvent(const Event& event) override {
        cudaError_t e = cudaEventQuery(Native(event));
        if (e == cudaErrorNotReady) {
            cudaGetLastError();
            return false;
        }
        AfterWait(e, "cudaEventQuery", event.device().index);
        return true;
    }

    void SynchronizeEvent(const Event& event) override {
        AfterWait(cudaEventSynchronize(Native(event)), "cudaEventSynchronize", event.device().index);
    }

    float ElapsedMs(const Event& start, const Event& end) override {
        float ms = 0;
        Check(cudaEventElapsedTime(&ms, Native(start), Native(end)), "cudaEventElapsedTime");
        return ms;
    }

    void SynchronizeDevice(int device) override {
        ScopedDevice guard(device);
        AfterWait(cudaDeviceSynchronize(), "cudaDeviceSynchronize", device);
    }

    void* CreateBlasHandle(int device) override {
        ScopedDevice guard(device);
        cublasHandle_t h = nullptr;
        cublasStatus_t st = cublasCreate(&h);
        // Split-K partial sums stay in float32 even for bfloat16/float16 outputs (rounded once, as on the cpu).
        if (st == CUBLAS_STATUS_SUCCESS) {
            st = cublasSetMathMode(
                h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
        }
        if (st != CUBLAS_STATUS_SUCCESS) {
            throw std::runtime_error(std::string("cuda: cublasCreate: ") + cublasGetStatusString(st));
        }
        return h;
    }

    void DestroyBlasHandle(void* handle, int) override { cublasDestroy(static_cast<cublasHandle_t>(handle)); }

    void SetBlasStream(void* handle, const Stream& stream) override {
        cublasStatus_t st = cublasSetStream(static_cast<cublasHandle_t>(handle), Native(stream));
        if (st != CUBLAS_STATUS_SUCCESS) {
            throw std::runtime_error(std::string("cuda: cublasSetStream: ") + cublasGetStatusString(st));
        }
    }

private:
    std::once_flag count_once_;
    int count_ = 0;
    std::string count_error_;
};

}  // namespace

REGISTER_PROVIDER_RUNTIME(kName, CudaRuntime);

}  // namespace infinitrain::cuda
