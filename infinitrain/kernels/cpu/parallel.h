// Exception safety for OpenMP regions and named out-of-memory errors for kernel scratch.
//
// An exception that leaves an OpenMP region calls std::terminate (the process
// aborts). RegionError catches inside the region, keeps the first exception
// and rethrows it on the calling thread after the region, so it reaches
// Python like any other kernel error.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>

namespace infinitrain::cpu {

class RegionError {
public:
    // Runs f(); an exception is recorded instead of propagating. After a failure later calls are skipped.
    template <typename F>
    void Run(F&& f) noexcept {
        if (failed_.load(std::memory_order_relaxed)) return;
        try {
            f();
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = std::current_exception();
            failed_.store(true, std::memory_order_relaxed);
        }
    }
    // Call after the region, on the thread that opened it.
    void Rethrow() {
        if (error_) std::rethrow_exception(error_);
    }

private:
    std::atomic<bool> failed_{false};
    std::mutex mu_;
    std::exception_ptr error_;
};

// A std::bad_alloc (Python's MemoryError) that says what was being allocated.
class OutOfMemory : public std::bad_alloc {
public:
    explicit OutOfMemory(std::string what) : what_(std::move(what)) {}
    const char* what() const noexcept override { return what_.c_str(); }

private:
    std::string what_;
};

inline std::string FormatBytes(double bytes) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) {
        bytes /= 1024;
        ++u;
    }
    char buf[64];
    std::snprintf(buf, sizeof(buf), u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
    return buf;
}

// Uninitialised scratch of `count` elements (pages are touched only when used); a failed
// allocation raises OutOfMemory naming the op and `what`. Nothing here throws inside a region.
template <typename C>
class Scratch {
public:
    Scratch() = default;
    Scratch(const char* op, const std::string& what, uint64_t count) { Allocate(op, what, count); }
    void Allocate(const char* op, const std::string& what, uint64_t count) {
        double bytes = static_cast<double>(count) * sizeof(C);
        // More than the machine's memory would be granted under overcommit and end in the OOM killer.
        double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
        std::string why = ": out of memory allocating " + FormatBytes(bytes) + " of scratch for " + what;
        if (physical > 0 && bytes > physical) {
            throw OutOfMemory(op + why + " (the machine has " + FormatBytes(physical) + ")");
        }
        try {
            data_.reset(new C[count]);
        } catch (const std::bad_alloc&) {
            throw OutOfMemory(op + why);
        }
    }
    C* get() const { return data_.get(); }

private:
    std::unique_ptr<C[]> data_;
};

}  // namespace infinitrain::cpu
