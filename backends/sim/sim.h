// Internal interface of the sim provider, shared by its runtime, kernels and
// CCL. Nothing outside backends/sim includes this.
#pragma once

#include <functional>

#include "infinitrain/runtime.h"

namespace infinitrain::sim {

constexpr const char* kName = "sim";

// The host address the runtime itself uses for a device address (device
// memory is mapped twice: a view the host cannot touch, handed out by Malloc,
// and a read-write view only the runtime uses). Raises std::invalid_argument
// for an address that is not sim device memory.
void* HostView(const void* device_ptr);

// Runs `work` on the worker thread of `stream` (nullptr: the device's default
// stream), after everything enqueued there before. An exception thrown by
// `work` becomes the device's sticky asynchronous error, rethrown (with its
// type) by the next synchronisation involving that device.
void Enqueue(int device, Stream stream, std::function<void()> work);

// Number of sim devices (INFINITRAIN_SIM_DEVICES, default 4).
int DeviceCount();

}  // namespace infinitrain::sim
