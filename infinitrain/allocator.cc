#include "infinitrain/allocator.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

#include "infinitrain/runtime.h"

namespace infinitrain {

struct MemorySegment {
    char* base;
    size_t size;
};

namespace {

constexpr size_t kMinBlock = 512;            // every block is a multiple of this
constexpr size_t kSmallSize = 1 << 20;       // requests up to this share small segments
constexpr size_t kSmallSegment = 2 << 20;    // size of a small segment
constexpr size_t kMinLargeAlloc = 10 << 20;  // requests below this get a kLargeSegment to split
constexpr size_t kLargeSegment = 20 << 20;
constexpr size_t kRoundLarge = 2 << 20;  // larger segments are multiples of this

size_t RoundUp(size_t n, size_t m) { return (n + m - 1) / m * m; }

size_t SegmentSize(size_t size) {
    if (size <= kSmallSize) return kSmallSegment;
    if (size < kMinLargeAlloc) return kLargeSegment;
    return RoundUp(size, kRoundLarge);
}

std::string MiB(int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    return buf;
}

}  // namespace

bool CachingAllocator::FreeOrder::operator()(const MemoryBlock* a, const MemoryBlock* b) const {
    if (a->stream.handle() != b->stream.handle()) return a->stream.handle() < b->stream.handle();
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
}

CachingAllocator::CachingAllocator(std::string what, RawAllocFn alloc, RawFreeFn free)
    : what_(std::move(what)), raw_alloc_(std::move(alloc)), raw_free_(std::move(free)) {}

MemoryBlock* CachingAllocator::FindFree(Pool& pool, size_t size, const Stream& stream) {
    MemoryBlock key{this, nullptr, nullptr, size, stream, {}, 0, false, false, nullptr, nullptr};
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream.handle() != stream.handle()) return nullptr;
    MemoryBlock* b = *it;
    pool.erase(it);
    stats_.cached -= static_cast<int64_t>(b->size);
    return b;
}

MemoryBlock* CachingAllocator::NewSegment(size_t size, bool small, const Stream& stream) {
    size_t seg_size = small ? kSmallSegment : SegmentSize(size);
    void* p = raw_alloc_(seg_size);
    if (!p) {
        // Out of memory: wait for blocks other streams hold, give back every unused segment, retry once.
        ProcessPending(true);
        ReleaseUnused();
        p = raw_alloc_(seg_size);
    }
    if (!p) {
        stats_.num_ooms += 1;
        throw OutOfMemoryError(what_ + ": out of memory allocating " + std::to_string(size) + " bytes (" +
                               MiB(static_cast<int64_t>(size)) + "; " + StatsLine() + ")");
    }
    auto* seg = new MemorySegment{static_cast<char*>(p), seg_size};
    segments_.push_back(seg);
    stats_.reserved += static_cast<int64_t>(seg_size);
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    return new MemoryBlock{this, seg, seg->base, seg_size, stream, {}, 0, false, small, nullptr, nullptr};
}

void CachingAllocator::Split(MemoryBlock* b, size_t size) {
    size_t rest = b->size - size;
    if (b->small ? rest < kMinBlock : rest <= kSmallSize) return;  // keep large remainders useful
    auto* r = new MemoryBlock{this, b->segment, b->ptr + size, rest, b->stream, {}, 0, false, b->small, b, b->next};
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    InsertFree(r);
}

// Puts a free block into its pool, merged with free neighbours (which share its stream: one segment,
// one stream).
void CachingAllocator::InsertFree(MemoryBlock* b) {
    Pool& pool = b->small ? small_ : large_;
    stats_.cached += static_cast<int64_t>(b->size);
    for (MemoryBlock* n : {b->prev, b->next}) {
        if (!n || n->allocated || n->pending_events) continue;
        pool.erase(n);
        if (n == b->prev) {
            b->ptr = n->ptr;
            b->prev = n->prev;
            if (n->prev) n->prev->next = b;
        } else {
            b->next = n->next;
            if (n->next) n->next->prev = b;
        }
        b->size += n->size;
        delete n;
    }
    pool.insert(b);
}

MemoryBlock* CachingAllocator::Allocate(size_t nbytes, const Stream& stream) {
    size_t size = RoundUp(std::max<size_t>(nbytes, 1), kMinBlock);
    if (size < nbytes) throw OutOfMemoryError(what_ + ": cannot allocate " + std::to_string(nbytes) + " bytes");
    bool small = size <= kSmallSize;
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_.empty()) ProcessPending(false);
    MemoryBlock* b = FindFree(small ? small_ : large_, size, stream);
    if (!b) b = NewSegment(size, small, stream);
    b->allocated = true;  // before Split, so the remainder does not merge back into it
    Split(b, size);
    stats_.allocated += static_cast<int64_t>(b->size);
    stats_.num_allocs += 1;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return b;
}

void CachingAllocator::Free(MemoryBlock* b) {
    std::lock_guard<std::mutex> lock(mu_);
    b->allocated = false;
    stats_.allocated -= static_cast<int64_t>(b->size);
    for (const Stream& s : b->uses) {
        DeviceRuntime* rt = nullptr;
        try {
            rt = &GetRuntime(s.device().type);
            Event e;
            if (!spare_events_.empty() && spare_events_.back().device() == s.device()) {
                e = spare_events_.back();
                spare_events_.pop_back();
            } else {
                e = rt->CreateEvent(s.device().index);
            }
            rt->RecordEvent(e, s);
            pending_.push_back({b, e});
            b->pending_events += 1;
        } catch (...) {
            // No event: wait for the stream now instead, so the block is safe to reuse.
            try {
                if (rt) rt->SynchronizeStream(s);
            } catch (...) {
            }
        }
    }
    b->uses.clear();
    if (b->pending_events) {
        stats_.pending += static_cast<int64_t>(b->size);
    } else {
        InsertFree(b);
    }
}

void CachingAllocator::RecordStream(MemoryBlock* b, const Stream& stream) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream == b->stream) return;
    for (const Stream& s : b->uses) {
        if (s == stream) return;
    }
    b->uses.push_back(stream);
}

void CachingAllocator::ProcessPending(bool wait) {
    size_t keep = 0;
    std::exception_ptr error;
    for (size_t i = 0; i < pending_.size(); ++i) {
        Pending p = pending_[i];
        bool done = true;
        try {
            DeviceRuntime& rt = GetRuntime(p.event.device().type);
            if (wait) {
                rt.SynchronizeEvent(p.event);
            } else {
                done = rt.QueryEvent(p.event);
            }
        } catch (...) {
            // The block is no longer in use by a failed device. A synchronisation hands over (and clears) what
            // earlier work raised, so that is rethrown below, once the lists are consistent. A query (the path
            // Free takes, which must not throw) raises only a device fault, which stays sticky in the runtime.
            if (wait && !error) error = std::current_exception();
        }
        if (!done) {
            pending_[keep++] = p;
            continue;
        }
        spare_events_.push_back(p.event);
        if (--p.block->pending_events == 0) {
            stats_.pending -= static_cast<int64_t>(p.block->size);
            InsertFree(p.block);
        }
    }
    pending_.resize(keep);
    if (error) std::rethrow_exception(error);
}

void CachingAllocator::ReleaseUnused() {
    for (Pool* pool : {&small_, &large_}) {
        for (auto it = pool->begin(); it != pool->end();) {
            MemoryBlock* b = *it;
            if (b->prev || b->next) {
                ++it;
                continue;
            }
            MemorySegment* seg = b->segment;
            it = pool->erase(it);
            stats_.cached -= static_cast<int64_t>(b->size);
            stats_.reserved -= static_cast<int64_t>(seg->size);
            raw_free_(seg->base);
            segments_.erase(std::find(segments_.begin(), segments_.end(), seg));
            delete seg;
            delete b;
        }
    }
}

void CachingAllocator::EmptyCache() {
    std::lock_guard<std::mutex> lock(mu_);
    ProcessPending(true);
    ReleaseUnused();
}

MemoryStats CachingAllocator::Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_.empty()) ProcessPending(false);
    return stats_;
}

void CachingAllocator::ResetPeak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated = stats_.allocated;
    stats_.peak_reserved = stats_.reserved;
}

std::string CachingAllocator::StatsLine() const {
    return MiB(stats_.allocated) + " allocated, " + MiB(stats_.reserved) + " reserved, " + MiB(stats_.cached) +
           " cached, " + MiB(stats_.pending) + " waiting for streams";
}

// ---- one allocator per device, and one for pinned host memory ----

namespace {

struct TypeAllocators {
    std::once_flag once;
    std::vector<CachingAllocator*> devices;  // leaked: blocks may be freed at any time
};
TypeAllocators g_allocators[kNumDeviceTypes];

}  // namespace

CachingAllocator& DeviceAllocator(const Device& device) {
    TypeAllocators& a = g_allocators[static_cast<int>(device.type)];
    std::call_once(a.once, [&] {
        DeviceType type = device.type;
        int n = device.is_cpu() ? 1 : GetRuntime(type).DeviceCount();
        for (int i = 0; i < n; ++i) {
            Device d{type, i};
            a.devices.push_back(new CachingAllocator(
                d.ToString(), [d](size_t size) { return GetRuntime(d.type).RawAlloc(size, d.index); },
                [d](void* p) { GetRuntime(d.type).RawFree(p, d.index); }));
        }
    });
    if (device.index < 0 || device.index >= static_cast<int>(a.devices.size())) {
        throw std::invalid_argument("device " + device.ToString() + " does not exist: " + DeviceTypeName(device.type) +
                                    " has " + std::to_string(a.devices.size()) + " device(s)");
    }
    return *a.devices[device.index];
}

CachingAllocator& PinnedAllocator() {
    if (!HasRuntime(DeviceType::kPrivateUse1)) {
        throw std::invalid_argument("pinned memory needs an accelerator provider; none is registered");
    }
    static CachingAllocator* pinned = new CachingAllocator(
        "pinned host memory", [](size_t size) { return GetRuntime(DeviceType::kPrivateUse1).HostAlloc(size); },
        [](void* p) { GetRuntime(DeviceType::kPrivateUse1).HostFree(p); });
    return *pinned;
}

}  // namespace infinitrain
