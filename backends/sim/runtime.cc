// The sim runtime: several simulated devices on the host.
//
// Device memory lives in memfd segments mapped twice: a PROT_NONE view whose
// addresses Malloc hands out (any host access faults, as on a real device)
// and a read-write view only this runtime (HostView) uses. Every stream has a
// worker thread running its closures in order; events are markers on those
// queues. A per-device caching allocator reuses a freed block only once every
// stream of its device has passed the point where it was freed.
#include "infinitrain/runtime.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/sim/sim.h"
#include "infinitrain/provider.h"

namespace infinitrain::sim {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxDevices = 64;
constexpr size_t kRound = 512;             // every block is a multiple of this
constexpr size_t kSmallMax = 1 << 20;      // requests up to 1 MiB share small segments
constexpr size_t kSmallSegment = 2 << 20;  // size of a small segment
constexpr size_t kLargeGranule = 2 << 20;  // large segments are multiples of this

size_t RoundUp(size_t n, size_t m) { return (n + m - 1) / m * m; }

std::string Hex(const void* p) {
    std::ostringstream s;
    s << p;
    return s.str();
}

// ---- segments: the double mapping ----

struct Segment {
    uintptr_t base;  // device view (PROT_NONE)
    char* host;      // read-write view of the same pages
    size_t size;
    int device;
};

// All devices' segments by device address, so HostView needs only the pointer.
class SegmentMap {
public:
    // The segment holding [p, p + n), or nullptr when p is not sim memory. Raises when the range overruns it.
    const Segment* Find(const void* p, size_t n = 0) const {
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
        std::unique_ptr<Segment> s = std::move(it->second);
        by_base_.erase(it);
        return s;
    }

private:
    mutable std::shared_mutex mu_;
    std::map<uintptr_t, std::unique_ptr<Segment>> by_base_;
};

SegmentMap& Segments() {
    static SegmentMap* m = new SegmentMap();  // leaked: workers may run during static destruction
    return *m;
}

// Maps `size` bytes twice; nullptr when the system refuses.
std::unique_ptr<Segment> MapSegment(size_t size, int device) {
    int fd = memfd_create("infinitrain-sim", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    void* dev = MAP_FAILED;
    void* host = MAP_FAILED;
    if (ftruncate(fd, static_cast<off_t>(size)) == 0) {
        dev = mmap(nullptr, size, PROT_NONE, MAP_SHARED, fd, 0);
        host = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);  // the mappings keep the pages alive
    if (dev == MAP_FAILED || host == MAP_FAILED) {
        if (dev != MAP_FAILED) munmap(dev, size);
        if (host != MAP_FAILED) munmap(host, size);
        return nullptr;
    }
    return std::unique_ptr<Segment>(
        new Segment{reinterpret_cast<uintptr_t>(dev), static_cast<char*>(host), size, device});
}

void UnmapSegment(const Segment& s) {
    munmap(reinterpret_cast<void*>(s.base), s.size);
    munmap(s.host, s.size);
}

// ---- streams and events ----

struct StreamState {
    int device = 0;
    uintptr_t id = 0;  // 0: the device's default stream
    std::mutex mu;
    std::condition_variable cv_work, cv_done;
    std::deque<std::pair<uint64_t, std::function<void()>>> queue;
    std::atomic<uint64_t> enqueued{0};   // written under mu
    std::atomic<uint64_t> completed{0};  // written under mu
    std::atomic<bool> closing{false};    // destroyed: the worker exits once drained
    std::thread worker;
};

// Set on worker threads, so synchronous calls from them fail instead of deadlocking.
thread_local StreamState* t_worker = nullptr;

// At exit the runtime object dies while workers may still hold closures whose tensors would free into it:
// after g_shutdown workers leak what they hold and stop. g_releasing counts workers dropping a closure
// (seq_cst: either the worker sees the flag or the destructor sees the count).
std::atomic<bool> g_shutdown{false};
std::atomic<int> g_releasing{0};

struct EventState {
    int device = 0;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0;   // generation of the latest Record
    uint64_t completed = 0;  // latest generation whose marker ran
    Clock::time_point time;  // when generation `completed` ran
};

struct DeviceState;
void SetError(DeviceState& d, std::exception_ptr e);

// Leaks `work` and the stream (its queue holds more closures) and ends the worker; see g_shutdown.
void Abandon(const std::shared_ptr<StreamState>& s, std::function<void()>& work) {
    new std::function<void()>(std::move(work));
    new std::shared_ptr<StreamState>(s);
}

void WorkerLoop(std::shared_ptr<StreamState> s, DeviceState* d) {
    t_worker = s.get();
    for (;;) {
        std::function<void()> work;
        uint64_t seq;
        if (g_shutdown.load()) return Abandon(s, work);
        {
            std::unique_lock<std::mutex> lock(s->mu);
            s->cv_work.wait(lock, [&] { return !s->queue.empty() || s->closing; });
            if (s->queue.empty()) break;
            seq = s->queue.front().first;
            work = std::move(s->queue.front().second);
            s->queue.pop_front();
        }
        try {
            work();
        } catch (...) {
            SetError(*d, std::current_exception());
        }
        // Drop what the closure holds (tensors may free here) before the item counts as done.
        g_releasing.fetch_add(1);
        if (g_shutdown.load()) {
            g_releasing.fetch_sub(1);
            return Abandon(s, work);
        }
        work = nullptr;
        g_releasing.fetch_sub(1);
        {
            std::lock_guard<std::mutex> lock(s->mu);
            s->completed.store(seq);
        }
        s->cv_done.notify_all();
    }
}

void Push(StreamState& s, std::function<void()> work) {
    {
        std::lock_guard<std::mutex> lock(s.mu);
        // Checked under mu: the worker of a destroyed stream may already be gone.
        if (s.closing) throw std::invalid_argument("sim: the stream was destroyed");
        uint64_t seq = s.enqueued.load() + 1;
        s.queue.emplace_back(seq, std::move(work));
        s.enqueued.store(seq);
    }
    s.cv_work.notify_one();
}

void Drain(StreamState& s) {
    if (t_worker == &s) throw std::runtime_error("sim: a stream cannot wait for itself from its own worker");
    std::unique_lock<std::mutex> lock(s.mu);
    uint64_t target = s.enqueued.load();
    s.cv_done.wait(lock, [&] { return s.completed.load() >= target; });
}

// ---- the caching allocator ----

using StreamPoint = std::pair<std::shared_ptr<StreamState>, uint64_t>;

struct Block {
    Block(Segment* s, size_t off, size_t sz, bool sm) : seg(s), offset(off), size(sz), small(sm) {}
    Segment* seg;
    size_t offset;
    size_t size;
    bool small;  // lives in the small pool
    bool allocated = false;
    Block* prev = nullptr;  // neighbours in the segment
    Block* next = nullptr;
    std::vector<StreamPoint> pending;  // reusable once each stream completed its point
    uintptr_t addr() const { return seg->base + offset; }
};

// Free blocks by (size, address); lookups by size alone find the best fit.
struct BySize {
    using is_transparent = void;
    bool operator()(const Block* a, const Block* b) const {
        return a->size != b->size ? a->size < b->size : a->addr() < b->addr();
    }
    bool operator()(const Block* a, size_t s) const { return a->size < s; }
    bool operator()(size_t s, const Block* b) const { return s < b->size; }
};

bool Ready(Block* b) {
    for (const StreamPoint& p : b->pending) {
        if (p.first->completed.load() < p.second) return false;
    }
    b->pending.clear();
    return true;
}

// Keeps, per stream, the later of the two points.
void MergePending(std::vector<StreamPoint>& into, const std::vector<StreamPoint>& from) {
    for (const StreamPoint& p : from) {
        auto it = std::find_if(into.begin(), into.end(), [&](const StreamPoint& q) { return q.first == p.first; });
        if (it == into.end()) {
            into.push_back(p);
        } else {
            it->second = std::max(it->second, p.second);
        }
    }
}

struct DeviceState {
    int index = 0;
    std::once_flag started;
    std::shared_ptr<StreamState> default_stream;

    std::mutex mu;  // streams, error
    std::vector<std::shared_ptr<StreamState>> streams;
    std::exception_ptr error;

    std::mutex alloc_mu;  // everything below
    std::set<Block*, BySize> free_small, free_large;
    std::unordered_map<uintptr_t, Block*> live;
    std::vector<Segment*> segments;
    MemoryStats stats;
};

void SetError(DeviceState& d, std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(d.mu);
    if (!d.error) d.error = e;  // the first error wins, as on a real device
}

void RethrowError(DeviceState& d) {
    std::exception_ptr e;
    {
        std::lock_guard<std::mutex> lock(d.mu);
        std::swap(e, d.error);
    }
    if (e) std::rethrow_exception(e);
}

std::shared_ptr<StreamState> StartStream(DeviceState& d, uintptr_t id) {
    auto s = std::make_shared<StreamState>();
    s->device = d.index;
    s->id = id;
    s->worker = std::thread(WorkerLoop, s, &d);
    std::lock_guard<std::mutex> lock(d.mu);
    d.streams.push_back(s);
    return s;
}

// Live streams of a device (destroyed ones still draining included).
std::vector<std::shared_ptr<StreamState>> StreamsOf(DeviceState& d) {
    std::lock_guard<std::mutex> lock(d.mu);
    auto& v = d.streams;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [](const std::shared_ptr<StreamState>& s) {
                               return s->closing && s->completed.load() == s->enqueued.load();
                           }),
            v.end());
    return v;
}

class State {
public:
    State() : count_(ParseDeviceCount()), devices_(count_) {
        for (int i = 0; i < count_; ++i) {
            devices_[i].reset(new DeviceState());
            devices_[i]->index = i;
        }
    }

    // Created on first use; leaked, since worker threads and frees from them may outlive static destruction.
    static State& Get() {
        static State* s = new State();
        return *s;
    }

    int count() const { return count_; }

    DeviceState& GetDevice(int index) {
        if (index < 0 || index >= count_) {
            throw std::invalid_argument("sim: device index " + std::to_string(index) + " out of range: there are " +
                                        std::to_string(count_) + " sim devices (INFINITRAIN_SIM_DEVICES)");
        }
        DeviceState& d = *devices_[index];
        std::call_once(d.started, [&] { d.default_stream = StartStream(d, 0); });
        return d;
    }

    std::shared_ptr<StreamState> GetStream(int device, Stream stream) {
        DeviceState& d = GetDevice(device);
        if (!stream) return d.default_stream;
        std::lock_guard<std::mutex> lock(mu_);
        auto it = streams_.find(reinterpret_cast<uintptr_t>(stream));
        if (it == streams_.end()) {
            throw std::invalid_argument("sim: stream " + Hex(stream) + " is not a live sim stream (destroyed?)");
        }
        if (it->second->device != device) {
            throw std::invalid_argument("sim: stream " + Hex(stream) + " belongs to sim:" +
                                        std::to_string(it->second->device) + ", not sim:" + std::to_string(device));
        }
        return it->second;
    }

    Stream CreateStream(int device) {
        DeviceState& d = GetDevice(device);
        std::lock_guard<std::mutex> lock(mu_);
        uintptr_t id = next_id_++;
        streams_[id] = StartStream(d, id);
        return reinterpret_cast<Stream>(id);
    }

    void DestroyStream(Stream stream, int device) {
        if (!stream) throw std::invalid_argument("sim: the default stream cannot be destroyed");
        GetStream(device, stream);  // validates
        std::shared_ptr<StreamState> s;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = streams_.find(reinterpret_cast<uintptr_t>(stream));
            if (it == streams_.end()) return;  // another thread destroyed it meanwhile
            s = it->second;
            streams_.erase(it);
        }
        // Like cudaStreamDestroy: returns at once; queued work still runs, then the worker exits.
        {
            std::lock_guard<std::mutex> lock(s->mu);
            s->worker.detach();
            s->closing = true;
        }
        s->cv_work.notify_one();
    }

    std::shared_ptr<EventState> GetEvent(Event event, int device) {
        GetDevice(device);
        std::lock_guard<std::mutex> lock(mu_);
        auto it = events_.find(reinterpret_cast<uintptr_t>(event));
        if (it == events_.end()) {
            throw std::invalid_argument("sim: event " + Hex(event) + " is not a live sim event (destroyed?)");
        }
        if (it->second->device != device) {
            throw std::invalid_argument("sim: event " + Hex(event) + " belongs to sim:" +
                                        std::to_string(it->second->device) + ", not sim:" + std::to_string(device));
        }
        return it->second;
    }

    Event CreateEvent(int device) {
        GetDevice(device);
        auto e = std::make_shared<EventState>();
        e->device = device;
        std::lock_guard<std::mutex> lock(mu_);
        uintptr_t id = next_id_++;
        events_[id] = e;
        return reinterpret_cast<Event>(id);
    }

    void DestroyEvent(Event event, int device) {
        GetEvent(event, device);
        std::lock_guard<std::mutex> lock(mu_);
        events_.erase(reinterpret_cast<uintptr_t>(event));  // pending markers hold their own reference
    }

    // Waits for every stream of `d` (the call is synchronous for the device).
    void DrainDevice(DeviceState& d) {
        if (t_worker && t_worker->device == d.index) {
            throw std::runtime_error("sim: synchronous call on sim:" + std::to_string(d.index) +
                                     " from one of its own stream workers would deadlock");
        }
        for (const auto& s : StreamsOf(d)) Drain(*s);
    }

private:
    static int ParseDeviceCount() {
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
    }

    int count_;
    std::vector<std::unique_ptr<DeviceState>> devices_;
    std::mutex mu_;  // streams_, events_, next_id_
    // Handles are ids, never reused, so a destroyed handle cannot alias a new one.
    uintptr_t next_id_ = 1;
    std::unordered_map<uintptr_t, std::shared_ptr<StreamState>> streams_;
    std::unordered_map<uintptr_t, std::shared_ptr<EventState>> events_;
};

// Points each busy stream of `d` has been enqueued to: work before them may still use a block freed now.
std::vector<StreamPoint> Snapshot(DeviceState& d) {
    std::vector<StreamPoint> points;
    for (auto& s : StreamsOf(d)) {
        uint64_t enq = s->enqueued.load();
        if (s->completed.load() < enq) points.emplace_back(s, enq);
    }
    return points;
}

// Splits `b` (unlinked from the free sets) so it is exactly `size`; the rest goes back free.
void Split(DeviceState& d, Block* b, size_t size) {
    if (b->size == size) return;
    Block* rest = new Block(b->seg, b->offset + size, b->size - size, b->small);
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    (rest->small ? d.free_small : d.free_large).insert(rest);
}

// Unmaps segments that are one free, reusable block. Holds alloc_mu.
void ReleaseCached(DeviceState& d) {
    std::vector<Segment*> keep;
    for (Segment* seg : d.segments) {
        bool whole = false;
        for (auto* set : {&d.free_small, &d.free_large}) {
            for (auto it = set->begin(); it != set->end(); ++it) {
                Block* b = *it;
                if (b->seg == seg && b->offset == 0 && b->size == seg->size && Ready(b)) {
                    set->erase(it);
                    delete b;
                    whole = true;
                    break;
                }
            }
            if (whole) break;
        }
        if (!whole) {
            keep.push_back(seg);
            continue;
        }
        d.stats.reserved -= static_cast<int64_t>(seg->size);
        std::unique_ptr<Segment> owned = Segments().Remove(seg->base);
        UnmapSegment(*owned);
    }
    d.segments = keep;
}

void* Allocate(DeviceState& d, size_t nbytes) {
    size_t size = RoundUp(std::max<size_t>(nbytes, 1), kRound);
    bool small = size <= kSmallMax;
    std::lock_guard<std::mutex> lock(d.alloc_mu);
    auto& pool = small ? d.free_small : d.free_large;
    Block* found = nullptr;
    // Best fit among the blocks every stream is done with.
    for (auto it = pool.lower_bound(size); it != pool.end(); ++it) {
        if (Ready(*it)) {
            found = *it;
            pool.erase(it);
            break;
        }
    }
    if (!found) {
        size_t seg_size = small ? kSmallSegment : RoundUp(size, kLargeGranule);
        std::unique_ptr<Segment> seg = MapSegment(seg_size, d.index);
        if (!seg) {
            ReleaseCached(d);
            seg = MapSegment(seg_size, d.index);
        }
        if (!seg) {
            throw std::runtime_error("sim:" + std::to_string(d.index) + " out of memory allocating " +
                                     std::to_string(nbytes) + " bytes (" + std::to_string(d.stats.reserved) +
                                     " bytes reserved): " + std::strerror(errno));
        }
        Segment* raw = seg.get();
        d.segments.push_back(raw);
        d.stats.reserved += static_cast<int64_t>(seg_size);
        Segments().Add(std::move(seg));
        found = new Block(raw, 0, seg_size, small);
    }
    Split(d, found, size);
    found->allocated = true;
    d.live[found->addr()] = found;
    d.stats.allocated += static_cast<int64_t>(size);
    d.stats.num_allocs += 1;
    d.stats.peak_allocated = std::max(d.stats.peak_allocated, d.stats.allocated);
    return reinterpret_cast<void*>(found->addr());
}

void Release(DeviceState& d, void* ptr) {
    std::vector<StreamPoint> points = Snapshot(d);
    std::lock_guard<std::mutex> lock(d.alloc_mu);
    auto it = d.live.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == d.live.end()) {
        throw std::invalid_argument("sim: Free of " + Hex(ptr) +
                                    ", which is not a live allocation on sim:" + std::to_string(d.index));
    }
    Block* b = it->second;
    d.live.erase(it);
    d.stats.allocated -= static_cast<int64_t>(b->size);
    b->allocated = false;
    b->pending = std::move(points);
    auto& pool = b->small ? d.free_small : d.free_large;
    // Coalesce with free neighbours; the merged block waits for the later of both points.
    for (Block* n : {b->prev, b->next}) {
        if (!n || n->allocated) continue;
        pool.erase(n);
        MergePending(b->pending, n->pending);
        if (n == b->prev) {
            b->offset = n->offset;
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

// Validates a device range and returns its host view.
char* HostRange(const void* p, size_t n, int* device) {
    const Segment* s = Segments().Find(p, n);
    if (!s) throw std::invalid_argument("sim: " + Hex(p) + " is not sim device memory");
    *device = s->device;
    return s->host + (reinterpret_cast<uintptr_t>(p) - s->base);
}

void CheckHostPointer(const void* p) {
    if (Segments().Find(p)) {
        throw std::invalid_argument("sim: " + Hex(p) + " is sim device memory, not host memory (wrong MemcpyKind?)");
    }
}

void CheckDevice(int got, int want, const void* p) {
    if (got != want) {
        throw std::invalid_argument("sim: " + Hex(p) + " is memory of sim:" + std::to_string(got) +
                                    ", the call named sim:" + std::to_string(want));
    }
}

class SimRuntime final : public DeviceRuntime {
public:
    // Static destruction at exit: queued work is abandoned, and no worker may free into this dead runtime.
    ~SimRuntime() override {
        g_shutdown.store(true);
        while (g_releasing.load() > 0) std::this_thread::yield();
    }

    DeviceType type() const override { return DeviceType::kPrivateUse1; }
    int DeviceCount() override { return State::Get().count(); }
    int CurrentDevice() override { return t_device_; }
    void SetDevice(int index) override {
        State::Get().GetDevice(index);
        t_device_ = index;
    }

    void* Malloc(size_t nbytes, int device) override { return Allocate(State::Get().GetDevice(device), nbytes); }
    void Free(void* ptr, int device) override {
        if (!ptr) return;
        Release(State::Get().GetDevice(device), ptr);
    }

    void Memcpy(void* dst, const void* src, size_t n, MemcpyKind kind, int device) override {
        if (n == 0) return;
        State& st = State::Get();
        st.GetDevice(device);
        int dd = -1, sd = -1;
        char* hdst = nullptr;
        const char* hsrc = nullptr;
        switch (kind) {
            case MemcpyKind::kHostToDevice:
                CheckHostPointer(src);
                hdst = HostRange(dst, n, &dd);
                hsrc = static_cast<const char*>(src);
                CheckDevice(dd, device, dst);
                break;
            case MemcpyKind::kDeviceToHost:
                CheckHostPointer(dst);
                hsrc = HostRange(src, n, &sd);
                hdst = static_cast<char*>(dst);
                CheckDevice(sd, device, src);
                break;
            case MemcpyKind::kDeviceToDevice:
                hsrc = HostRange(src, n, &sd);
                hdst = HostRange(dst, n, &dd);
                CheckDevice(sd, device, src);
                break;
        }
        // Synchronous: everything queued on the devices involved runs first.
        for (int d : {sd, dd}) {
            if (d >= 0) st.DrainDevice(st.GetDevice(d));
        }
        for (int d : {sd, dd}) {
            if (d >= 0) RethrowError(st.GetDevice(d));
        }
        std::memmove(hdst, hsrc, n);
    }

    void MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind kind, int device, Stream stream) override {
        if (n == 0) return;
        State& st = State::Get();
        std::shared_ptr<StreamState> s = st.GetStream(device, stream);
        int dd = -1, sd = -1;
        switch (kind) {
            case MemcpyKind::kHostToDevice: {
                CheckHostPointer(src);
                char* hdst = HostRange(dst, n, &dd);
                CheckDevice(dd, device, dst);
                // Staged now, like a pageable cudaMemcpyAsync: the caller may reuse `src` at once.
                auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                                  static_cast<const char*>(src) + n);
                Push(*s, [hdst, staged] { std::memcpy(hdst, staged->data(), staged->size()); });
                return;
            }
            case MemcpyKind::kDeviceToHost: {
                CheckHostPointer(dst);
                const char* hsrc = HostRange(src, n, &sd);
                CheckDevice(sd, device, src);
                Push(*s, [dst, hsrc, n] { std::memcpy(dst, hsrc, n); });
                return;
            }
            case MemcpyKind::kDeviceToDevice: {
                const char* hsrc = HostRange(src, n, &sd);
                char* hdst = HostRange(dst, n, &dd);
                CheckDevice(sd, device, src);
                Push(*s, [hdst, hsrc, n] { std::memmove(hdst, hsrc, n); });
                return;
            }
        }
    }

    void Memset(void* ptr, int value, size_t n, int device, Stream stream) override {
        if (n == 0) return;
        State& st = State::Get();
        std::shared_ptr<StreamState> s = st.GetStream(device, stream);
        int d = -1;
        char* h = HostRange(ptr, n, &d);
        CheckDevice(d, device, ptr);
        Push(*s, [h, value, n] { std::memset(h, value, n); });
    }

    Stream CreateStream(int device) override { return State::Get().CreateStream(device); }
    void DestroyStream(Stream stream, int device) override { State::Get().DestroyStream(stream, device); }
    void SynchronizeStream(Stream stream, int device) override {
        State& st = State::Get();
        Drain(*st.GetStream(device, stream));
        RethrowError(st.GetDevice(device));
    }
    void StreamWaitEvent(Stream stream, Event event, int device) override {
        State& st = State::Get();
        std::shared_ptr<StreamState> s = st.GetStream(device, stream);
        std::shared_ptr<EventState> e = st.GetEvent(event, device);
        uint64_t gen;
        {
            std::lock_guard<std::mutex> lock(e->mu);
            gen = e->recorded;
        }
        if (gen == 0) return;  // never recorded: nothing to wait for (as in CUDA)
        Push(*s, [e, gen] {
            std::unique_lock<std::mutex> lock(e->mu);
            e->cv.wait(lock, [&] { return e->completed >= gen; });
        });
    }

    Event CreateEvent(int device) override { return State::Get().CreateEvent(device); }
    void DestroyEvent(Event event, int device) override { State::Get().DestroyEvent(event, device); }
    void RecordEvent(Event event, Stream stream, int device) override {
        State& st = State::Get();
        std::shared_ptr<StreamState> s = st.GetStream(device, stream);
        std::shared_ptr<EventState> e = st.GetEvent(event, device);
        uint64_t gen;
        {
            std::lock_guard<std::mutex> lock(e->mu);
            gen = ++e->recorded;
        }
        auto mark = [e, gen] {
            {
                std::lock_guard<std::mutex> lock(e->mu);
                if (gen > e->completed) {
                    e->completed = gen;
                    e->time = Clock::now();
                }
            }
            e->cv.notify_all();
        };
        try {
            Push(*s, mark);
        } catch (...) {
            mark();  // never leave waiters on a marker that will not run
            throw;
        }
    }
    bool QueryEvent(Event event, int device) override {
        std::shared_ptr<EventState> e = State::Get().GetEvent(event, device);
        std::lock_guard<std::mutex> lock(e->mu);
        return e->completed >= e->recorded;
    }
    void SynchronizeEvent(Event event, int device) override {
        State& st = State::Get();
        std::shared_ptr<EventState> e = st.GetEvent(event, device);
        if (t_worker) throw std::runtime_error("sim: SynchronizeEvent from a stream worker would deadlock");
        {
            std::unique_lock<std::mutex> lock(e->mu);
            uint64_t gen = e->recorded;
            e->cv.wait(lock, [&] { return e->completed >= gen; });
        }
        RethrowError(st.GetDevice(device));
    }
    float ElapsedMs(Event start, Event end, int device) override {
        State& st = State::Get();
        Clock::time_point t[2];
        int k = 0;
        for (Event ev : {start, end}) {
            std::shared_ptr<EventState> e = st.GetEvent(ev, device);
            std::lock_guard<std::mutex> lock(e->mu);
            const char* which = k == 0 ? "start" : "end";
            if (e->recorded == 0)
                throw std::runtime_error(std::string("sim: ElapsedMs: ") + which + " event was never recorded");
            if (e->completed < e->recorded) {
                throw std::runtime_error(std::string("sim: ElapsedMs: ") + which +
                                         " event has not completed yet (synchronize it first)");
            }
            t[k++] = e->time;
        }
        return std::chrono::duration<float, std::milli>(t[1] - t[0]).count();
    }

    void SynchronizeDevice(int device) override {
        State& st = State::Get();
        DeviceState& d = st.GetDevice(device);
        st.DrainDevice(d);
        RethrowError(d);
    }
    MemoryStats GetMemoryStats(int device) override {
        DeviceState& d = State::Get().GetDevice(device);
        std::lock_guard<std::mutex> lock(d.alloc_mu);
        return d.stats;
    }
    void ResetPeakMemory(int device) override {
        DeviceState& d = State::Get().GetDevice(device);
        std::lock_guard<std::mutex> lock(d.alloc_mu);
        d.stats.peak_allocated = d.stats.allocated;
    }

private:
    static thread_local int t_device_;
};

thread_local int SimRuntime::t_device_ = 0;

}  // namespace

void* HostView(const void* device_ptr) {
    int device;
    return HostRange(device_ptr, 0, &device);
}

void Enqueue(int device, Stream stream, std::function<void()> work) {
    Push(*State::Get().GetStream(device, stream), std::move(work));
}

int DeviceCount() { return State::Get().count(); }

REGISTER_PROVIDER_RUNTIME(kName, SimRuntime);

}  // namespace infinitrain::sim
