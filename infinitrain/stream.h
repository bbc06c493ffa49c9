// Streams and events: small value types naming a runtime's handle together
// with the device it belongs to. The runtime that made a handle owns it; these
// types neither create nor destroy anything (see StreamFromPool, OwnedEvent).
#pragma once

#include <cstdint>
#include <string>

#include "infinitrain/device.h"

namespace infinitrain {

class Stream {
public:
    Stream() = default;  // the CPU's stream: work runs when it is issued
    Stream(Device device, void* handle) : device_(device), handle_(handle) {}
    // A device's default stream (handle nullptr).
    static Stream Default(Device device) { return Stream(device, nullptr); }

    const Device& device() const { return device_; }
    void* handle() const { return handle_; }
    bool is_default() const { return handle_ == nullptr; }
    bool operator==(const Stream& o) const { return handle_ == o.handle_ && device_ == o.device_; }
    bool operator!=(const Stream& o) const { return !(*this == o); }
    std::string ToString() const;

private:
    Device device_;
    void* handle_ = nullptr;
};

class Event {
public:
    Event() = default;
    Event(Device device, void* handle) : device_(device), handle_(handle) {}

    const Device& device() const { return device_; }
    void* handle() const { return handle_; }
    bool valid() const { return handle_ != nullptr; }

private:
    Device device_;
    void* handle_ = nullptr;
};

}  // namespace infinitrain
