// Internal interface of the sim provider, shared by its runtime, kernels and
// CCL. Nothing outside backends/sim includes this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "infinitrain/stream.h"

namespace infinitrain::sim {

constexpr const char* kName = "sim";

// Number of sim devices (INFINITRAIN_SIM_DEVICES, default 4). Raises for a bad setting.
int DeviceCount();
// Raises std::invalid_argument unless 0 <= device < DeviceCount().
void CheckDeviceIndex(int device);

// ---- device memory (memory.cc) ----

// Maps nbytes of device memory twice: a view the host cannot touch, whose address is returned, and a
// read-write view only the runtime uses. nullptr when the device's capacity (INFINITRAIN_SIM_MEMORY)
// would be exceeded or the system refuses.
void* MapDeviceMemory(size_t nbytes, int device);
void UnmapDeviceMemory(void* ptr, int device);
// The host view of [p, p + n) and its device; raises std::invalid_argument when p is not sim device
// memory or the range runs past its allocation.
char* HostRange(const void* p, size_t n, int* device);
void* HostView(const void* device_ptr);
// Raises when p is sim device memory (a host pointer was expected).
void CheckHostPointer(const void* p);
// Pinned host memory: plain host memory that async copies read when they run (not at issue).
void* AllocPinned(size_t nbytes);
void FreePinned(void* ptr);
bool IsPinned(const void* p);
// Bytes of device memory one device may map (INFINITRAIN_SIM_MEMORY; default: the host's physical memory
// divided by the device count, at most 16 GiB). Raises for a bad setting.
int64_t Capacity();

// ---- streams and events (streams.cc) ----

// Runs `work` on the stream's worker thread after everything enqueued there before. An exception
// thrown by `work` becomes the device's sticky asynchronous error, rethrown (with its type) by the next
// synchronisation involving that device.
void Enqueue(const Stream& stream, std::function<void()> work);
Stream CreateStream(int device);
void SynchronizeStream(const Stream& stream);
void StreamWaitEvent(const Stream& stream, const Event& event);
Event CreateEvent(int device);
void DestroyEvent(const Event& event);
void RecordEvent(const Event& event, const Stream& stream);
bool QueryEvent(const Event& event);
void SynchronizeEvent(const Event& event);
float ElapsedMs(const Event& start, const Event& end);
// Waits for every stream of the device, then rethrows its pending error.
void SynchronizeDevice(int device);
// Waits for every stream of the device and leaves its pending error for the next synchronisation.
void WaitForDevice(int device);
// At exit: queued work is abandoned and workers stop touching the runtime.
void Shutdown();

}  // namespace infinitrain::sim
