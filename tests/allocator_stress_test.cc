// Allocator stress on sim: threads allocate blocks on one stream, fill them,
// have work on another stream read them later, free them at once and
// allocate again. A block handed out while a stream still uses it shows up as
// a reader seeing the next owner's poison. At the end the statistics must
// balance and every block must be free. Runs INFINITRAIN_STRESS_SECONDS
// (default 3) with INFINITRAIN_STRESS_THREADS threads (default 8).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "backends/sim/sim.h"
#include "infinitrain/allocator.h"
#include "infinitrain/provider.h"
#include "infinitrain/runtime.h"

using namespace infinitrain;

namespace {

int EnvInt(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
}

bool Balanced(const MemoryStats& s) { return s.reserved == s.allocated + s.cached + s.pending; }

}  // namespace

int main() {
    RegisterProvider({"sim", DataType::kBFloat16});
    const int seconds = EnvInt("INFINITRAIN_STRESS_SECONDS", 3);
    const int nthreads = EnvInt("INFINITRAIN_STRESS_THREADS", 8);
    const Device dev{DeviceType::kPrivateUse1, 0};
    DeviceRuntime& rt = GetRuntime(dev.type);
    CachingAllocator& alloc = DeviceAllocator(dev);
    const std::vector<Stream> streams = {StreamFromPool(dev), StreamFromPool(dev), StreamFromPool(dev)};
    std::atomic<int64_t> bad{0}, checked{0}, iterations{0}, unbalanced{0};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);

    auto worker = [&](int id) {
        std::mt19937_64 rng(static_cast<uint64_t>(id) * 7919 + 1);
        while (std::chrono::steady_clock::now() < deadline) {
            const Stream& a = streams[rng() % streams.size()];
            const Stream& b = streams[rng() % streams.size()];
            size_t n = rng() % 4 == 0 ? (1 << 20) + rng() % (3 << 20) : 1 + rng() % 65536;
            unsigned char pattern = static_cast<unsigned char>(1 + rng() % 250);
            MemoryBlock* blk = alloc.Allocate(n, a);
            rt.MemsetAsync(blk->ptr, pattern, n, a);
            OwnedEvent filled(dev);
            rt.RecordEvent(filled.get(), a);
            rt.StreamWaitEvent(b, filled.get());
            alloc.RecordStream(blk, b);  // a no-op when b is a
            const unsigned char* host = static_cast<const unsigned char*>(sim::HostView(blk->ptr));
            unsigned delay = static_cast<unsigned>(rng() % 200);
            sim::Enqueue(b, [host, n, pattern, delay, &bad, &checked] {
                std::this_thread::sleep_for(std::chrono::microseconds(delay));
                for (size_t i = 0; i < n; ++i) {
                    if (host[i] != pattern) {
                        bad += 1;
                        break;
                    }
                }
                checked += 1;
            });
            alloc.Free(blk);
            // Likely the same memory when the allocator wrongly reuses it: poison it on stream a.
            MemoryBlock* again = alloc.Allocate(n, a);
            rt.MemsetAsync(again->ptr, 0, n, a);
            alloc.Free(again);
            if (rng() % 512 == 0) alloc.EmptyCache();
            if (rng() % 64 == 0 && !Balanced(alloc.Stats())) unbalanced += 1;
            iterations += 1;
        }
    };
    std::vector<std::thread> threads;
    for (int i = 0; i < nthreads; ++i) threads.emplace_back(worker, i);
    for (std::thread& t : threads) t.join();
    rt.SynchronizeDevice(dev.index);

    MemoryStats end = alloc.Stats();
    alloc.EmptyCache();
    MemoryStats empty = alloc.Stats();
    std::printf("%d threads, %d s: %lld iterations, %lld reads checked, %lld saw reused memory\n", nthreads, seconds,
                static_cast<long long>(iterations.load()), static_cast<long long>(checked.load()),
                static_cast<long long>(bad.load()));
    std::printf("end: allocated %lld, reserved %lld, cached %lld, pending %lld; after empty_cache reserved %lld\n",
                static_cast<long long>(end.allocated), static_cast<long long>(end.reserved),
                static_cast<long long>(end.cached), static_cast<long long>(end.pending),
                static_cast<long long>(empty.reserved));
    bool ok = bad == 0 && unbalanced == 0 && checked == iterations && iterations > 0 && end.allocated == 0 &&
              Balanced(end) && empty.reserved == 0 && empty.pending == 0;
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
