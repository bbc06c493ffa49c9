// sim device memory: memfd segments mapped twice, a PROT_NONE view whose
// addresses the runtime hands out (any host access faults, as on a real
// device) and a read-write view only the runtime uses. Each device may map up
// to its capacity; beyond it allocation fails like a full device. Caching,
// splitting and reuse are the core allocator's: every RawAlloc maps a segment.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/sim/sim.h"

namespace infinitrain::sim {
namespace {

constexpr int kMaxDevices = 64;

std::string Hex(const void* p) {
    std::ostringstream s;
    s << p;
    return s.str();
}

struct Segment {
    uintptr_t base;  // device view (PROT_NONE)
    char* host;      // read-write view of the same pages
    size_t size;
    int device;
};

// Every device's segments by device address, so HostRange needs only the pointer.
class SegmentMap {
public:
    const Segment* Find(const void* p, size_t n) const {
        uintptr_t a = reinterpret_cast<uintptr_t>(p);
        std::shared_lock<std::shared_mutex> lock(mu_);
        auto it = by_base_.upper_bound(a);
        if (it == by_base_.begin()) return nullptr;
        --it;
        const Segment* s = it->second.get();
        if (a >= s->base + s->size) return nullptr;
        if (n > s->base + s->size - a) {
            throw std::invalid_argument("sim: range of " + std::to_string(n) + " bytes at " + Hex(p) +
                                        " runs past the end of its device allocation");
        }
        return s;
    }
    void Add(std::unique_ptr<Segment> s) {
        std::unique_lock<std::shared_mutex> lock(mu_);
        uintptr_t b = s->base;
        by_base_[b] = std::move(s);
    }
    std::unique_ptr<Segment> Remove(uintptr_t base) {
        std::unique_lock<std::shared_mutex> lock(mu_);
        auto it = by_base_.find(base);
        if (it == by_base_.end()) return nullptr;
        std::unique_ptr<Segment> s = std::move(it->second);
        by_base_.erase(it);
        return s;
    }

private:
    mutable std::shared_mutex mu_;
    std::map<uintptr_t, std::unique_ptr<Segment>> by_base_;
};

SegmentMap& Segments() {
    static SegmentMap* m = new SegmentMap();  // leaked: frees may come during static destruction
    return *m;
}

std::atomic<int64_t> g_mapped[kMaxDevices];

int64_t ParseSize(const char* env) {
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(env, &end);
    int64_t scale = 1;
    if (end && *end) {
        std::string unit(end);
        if (unit == "K" || unit == "KiB") {
            scale = int64_t{1} << 10;
        } else if (unit == "M" || unit == "MiB") {
            scale = int64_t{1} << 20;
        } else if (unit == "G" || unit == "GiB") {
            scale = int64_t{1} << 30;
        } else {
            scale = 0;
        }
    }
    if (errno || end == env || scale == 0 || !(v > 0) || v * static_cast<double>(scale) > 9.0e18) {
        throw std::invalid_argument(std::string("INFINITRAIN_SIM_MEMORY='") + env +
                                    "': expected a positive size in bytes, optionally with K, M or G (e.g. 8G)");
    }
    return static_cast<int64_t>(v * static_cast<double>(scale));
}

// Pinned host blocks, so copies know which host sources to read late.
std::mutex g_pinned_mu;
std::map<uintptr_t, size_t> g_pinned;

}  // namespace

int DeviceCount() {
    static const int count = [] {
        const char* env = std::getenv("INFINITRAIN_SIM_DEVICES");
        if (!env || !*env) return 4;
        char* end = nullptr;
        errno = 0;
        long n = std::strtol(env, &end, 10);
        if (errno || *end || n < 1 || n > kMaxDevices) {
            throw std::invalid_argument(std::string("INFINITRAIN_SIM_DEVICES='") + env +
                                        "': expected a whole number of sim devices from 1 to " +
                                        std::to_string(kMaxDevices));
        }
        return static_cast<int>(n);
    }();
    return count;
}

void CheckDeviceIndex(int device) {
    if (device < 0 || device >= DeviceCount()) {
        throw std::invalid_argument("sim: device index " + std::to_string(device) + " out of range: there are " +
                                    std::to_string(DeviceCount()) + " sim devices (INFINITRAIN_SIM_DEVICES)");
    }
}

namespace {

int64_t DefaultCapacity() {
    // The host's memory shared by the devices, at most 16 GiB each: a model that fits the sim fits the host.
    int64_t capacity = int64_t{16} << 30;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
        capacity = std::min(capacity, static_cast<int64_t>(pages) * page / DeviceCount());
    }
    return std::max<int64_t>(capacity, 1);
}

}  // namespace

int64_t Capacity() {
    static const int64_t capacity = [] {
        const char* env = std::getenv("INFINITRAIN_SIM_MEMORY");
        return env && *env ? ParseSize(env) : DefaultCapacity();
    }();
    return capacity;
}

void* MapDeviceMemory(size_t size, int device) {
    CheckDeviceIndex(device);
    std::atomic<int64_t>& mapped = g_mapped[device];
    int64_t n = static_cast<int64_t>(size);
    if (mapped.fetch_add(n) + n > Capacity()) {
        mapped.fetch_sub(n);
        return nullptr;
    }
    void* dev = MAP_FAILED;
    void* host = MAP_FAILED;
    int fd = memfd_create("infinitrain-sim", MFD_CLOEXEC);
    if (fd >= 0) {
        if (ftruncate(fd, static_cast<off_t>(size)) == 0) {
            dev = mmap(nullptr, size, PROT_NONE, MAP_SHARED, fd, 0);
            host = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        }
        close(fd);  // the mappings keep the pages alive
    }
    if (dev == MAP_FAILED || host == MAP_FAILED) {
        if (dev != MAP_FAILED) munmap(dev, size);
        if (host != MAP_FAILED) munmap(host, size);
        mapped.fetch_sub(n);
        return nullptr;
    }
    Segments().Add(std::unique_ptr<Segment>(
        new Segment{reinterpret_cast<uintptr_t>(dev), static_cast<char*>(host), size, device}));
    return dev;
}

void UnmapDeviceMemory(void* ptr, int device) {
    std::unique_ptr<Segment> s = Segments().Remove(reinterpret_cast<uintptr_t>(ptr));
    if (!s || s->device != device) {
        throw std::invalid_argument("sim: RawFree of " + Hex(ptr) + ", which sim:" + std::to_string(device) +
                                    " did not map");
    }
    munmap(reinterpret_cast<void*>(s->base), s->size);
    munmap(s->host, s->size);
    g_mapped[device].fetch_sub(static_cast<int64_t>(s->size));
}

char* HostRange(const void* p, size_t n, int* device) {
    const Segment* s = Segments().Find(p, n);
    if (!s) throw std::invalid_argument("sim: " + Hex(p) + " is not sim device memory");
    *device = s->device;
    return s->host + (reinterpret_cast<uintptr_t>(p) - s->base);
}

void* HostView(const void* device_ptr) {
    int device;
    return HostRange(device_ptr, 0, &device);
}

void CheckHostPointer(const void* p) {
    if (Segments().Find(p, 0)) {
        throw std::invalid_argument("sim: " + Hex(p) + " is sim device memory, not host memory (wrong MemcpyKind?)");
    }
}

void* AllocPinned(size_t nbytes) {
    void* p = std::malloc(nbytes ? nbytes : 1);
    if (!p) return nullptr;
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    g_pinned[reinterpret_cast<uintptr_t>(p)] = nbytes;
    return p;
}

void FreePinned(void* ptr) {
    {
        std::lock_guard<std::mutex> lock(g_pinned_mu);
        g_pinned.erase(reinterpret_cast<uintptr_t>(ptr));
    }
    std::free(ptr);
}

bool IsPinned(const void* p) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    auto it = g_pinned.upper_bound(a);
    if (it == g_pinned.begin()) return false;
    --it;
    return a < it->first + it->second;
}

}  // namespace infinitrain::sim
