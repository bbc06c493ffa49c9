// One object per device type (a runtime, a CCL), made on first use by a
// factory that is registered once. Shared by the runtime and CCL registries.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "infinitrain/device.h"

namespace infinitrain {

template <typename T>
class PerDeviceType {
public:
    using Factory = std::function<std::unique_ptr<T>()>;

    // `what` names the object in errors ("device runtime", "CCL"); `missing` is the error for a device type
    // without one, with "%s" for the type's name.
    PerDeviceType(const char* what, const char* missing) : what_(what), missing_(missing) {}

    void Register(DeviceType type, Factory factory, const char* site) {
        std::lock_guard<std::mutex> lock(mu_);
        Slot& s = slots_[static_cast<int>(type)];
        if (s.factory) {
            throw std::runtime_error(std::string(what_) + " for '" + DeviceTypeName(type) + "' registered twice: at " +
                                     s.site + " and at " + site);
        }
        s.factory = std::move(factory);
        s.site = site;
    }

    bool Has(DeviceType type) {
        std::lock_guard<std::mutex> lock(mu_);
        return static_cast<bool>(slots_[static_cast<int>(type)].factory);
    }

    // Creates the object on first use; raises std::runtime_error when none is registered.
    T& Get(DeviceType type) {
        Slot& s = slots_[static_cast<int>(type)];
        if (T* ready = s.ready.load(std::memory_order_acquire)) return *ready;  // every allocation comes here
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (!s.factory) {
                std::string msg = missing_;
                msg.replace(msg.find("%s"), 2, DeviceTypeName(type));
                throw std::runtime_error(msg);
            }
        }
        std::call_once(s.once, [&] {
            s.object = s.factory();
            s.ready.store(s.object.get(), std::memory_order_release);
        });
        return *s.object;
    }

private:
    struct Slot {
        Factory factory;
        std::string site;
        std::unique_ptr<T> object;
        std::once_flag once;
        std::atomic<T*> ready{nullptr};
    };
    const char* what_;
    const char* missing_;
    std::mutex mu_;
    Slot slots_[kNumDeviceTypes];
};

}  // namespace infinitrain
