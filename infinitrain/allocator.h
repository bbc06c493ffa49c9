// The caching allocator: one per device, for every device type, over the raw
// memory its runtime supplies (DeviceRuntime::RawAlloc/RawFree), plus one for
// page-locked host memory (HostAlloc/HostFree of the registered provider).
//
// Blocks are stream-ordered: a block belongs to the stream it was allocated
// on, and once freed it is handed out again at once, but only for that stream,
// whose later work runs after everything that used the block. A block also
// used on other streams (RecordStream; the dispatcher calls it for every input
// on a stream other than its own) waits until an event recorded on each of
// those streams at free time has completed. Sizes are rounded to 512 bytes;
// requests up to 1 MiB share 2 MiB segments, larger ones get segments of
// their own (20 MiB for requests under 10 MiB, so they can be split), and
// freed neighbours merge. When the runtime is out of memory the allocator
// waits for pending blocks, returns every unused segment and retries once,
// then raises OutOfMemoryError with the device, the request and the statistics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "infinitrain/stream.h"

namespace infinitrain {

class OutOfMemoryError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct MemoryStats {
    int64_t allocated = 0;       // bytes in blocks handed out and not yet freed
    int64_t reserved = 0;        // bytes held from the runtime (segments), cached blocks included
    int64_t cached = 0;          // bytes in free blocks ready for reuse
    int64_t pending = 0;         // bytes in freed blocks that wait for other streams
    int64_t peak_allocated = 0;  // high-water mark of `allocated` since the last reset
    int64_t peak_reserved = 0;
    int64_t num_allocs = 0;  // allocations served
    int64_t num_ooms = 0;    // requests the runtime could not serve even after emptying the cache
};

struct MemoryBlock;
struct MemorySegment;

class CachingAllocator {
public:
    using RawAllocFn = std::function<void*(size_t)>;
    using RawFreeFn = std::function<void(void*)>;
    // `what` names the memory in errors ("sim:0", "pinned host memory").
    CachingAllocator(std::string what, RawAllocFn alloc, RawFreeFn free);
    ~CachingAllocator() = delete;  // allocators live for the process: blocks may be freed at any time

    // A block of at least nbytes usable by work on `stream`. Raises OutOfMemoryError.
    MemoryBlock* Allocate(size_t nbytes, const Stream& stream);
    // Returns the block; never raises (it is called from destructors).
    void Free(MemoryBlock* block);
    // Marks that work on `stream` uses the block, so its memory waits for that work when freed.
    void RecordStream(MemoryBlock* block, const Stream& stream);
    // Returns every unused segment to the runtime (blocks waiting for streams are waited for first).
    void EmptyCache();
    MemoryStats Stats();
    void ResetPeak();

private:
    struct FreeOrder {
        bool operator()(const MemoryBlock* a, const MemoryBlock* b) const;
    };
    using Pool = std::set<MemoryBlock*, FreeOrder>;

    MemoryBlock* FindFree(Pool& pool, size_t size, const Stream& stream);
    MemoryBlock* NewSegment(size_t size, bool small, const Stream& stream);
    void Split(MemoryBlock* b, size_t size);
    void InsertFree(MemoryBlock* b);
    void ProcessPending(bool wait);
    void ReleaseUnused();
    std::string StatsLine() const;

    const std::string what_;
    RawAllocFn raw_alloc_;
    RawFreeFn raw_free_;
    std::mutex mu_;
    Pool small_, large_;
    std::vector<MemorySegment*> segments_;
    struct Pending {
        MemoryBlock* block;
        Event event;
    };
    std::vector<Pending> pending_;
    std::vector<Event> spare_events_;
    MemoryStats stats_;
};

// A block of device (or pinned host) memory.
struct MemoryBlock {
    CachingAllocator* owner;
    MemorySegment* segment;
    char* ptr;
    size_t size;
    Stream stream;             // the stream it was allocated on
    std::vector<Stream> uses;  // other streams that used it
    int pending_events = 0;    // events still to complete before it is free
    bool allocated = false;
    bool small = false;
    MemoryBlock* prev = nullptr;  // neighbours in the segment
    MemoryBlock* next = nullptr;
};

// The allocator of a device (created on first use; raises for a device that does not exist).
CachingAllocator& DeviceAllocator(const Device& device);
// The allocator of page-locked host memory, from the registered provider's runtime (plain host memory
// when no provider is registered).
CachingAllocator& PinnedAllocator();

}  // namespace infinitrain
