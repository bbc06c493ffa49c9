// The caching allocator over a counting raw allocator (no device): sizes rounded to 512 bytes, small requests
// sharing 2 MiB segments and large ones their own, a freed block reused for its stream at once, freed
// neighbours merged, statistics that balance, EmptyCache returning every unused segment, and an
// OutOfMemoryError that names the memory and the request after one retry with the cache emptied.
#include "infinitrain/allocator.h"

#include <cstdlib>
#include <map>
#include <string>

#include "tests/cc/check.h"

using namespace infinitrain;

namespace {

// Raw memory from malloc, counted; refuses beyond `limit` bytes held.
struct Raw {
    size_t limit = SIZE_MAX, held = 0;
    int allocs = 0, frees = 0;
    std::map<void*, size_t> live;
    void* Alloc(size_t n) {
        if (held + n > limit) return nullptr;
        void* p = std::malloc(n);
        live[p] = n;
        held += n;
        allocs += 1;
        return p;
    }
    void Free(void* p) {
        held -= live.at(p);
        live.erase(p);
        std::free(p);
        frees += 1;
    }
};

CachingAllocator* Make(Raw& raw, const char* what) {
    // Allocators live for the process (their destructor is deleted): these are leaked on purpose.
    return new CachingAllocator(
        what, [&raw](size_t n) { return raw.Alloc(n); }, [&raw](void* p) { raw.Free(p); });
}

bool Balanced(const MemoryStats& s) { return s.reserved == s.allocated + s.cached + s.pending; }

const Stream kStream;  // the CPU's stream: no events, so nothing waits

void TestSmallBlocksShareASegmentAndComeBack() {
    Raw raw;
    CachingAllocator& a = *Make(raw, "test:small");
    MemoryBlock* x = a.Allocate(1, kStream);
    MemoryBlock* y = a.Allocate(700, kStream);
    CHECK(raw.allocs == 1 && raw.held == (2u << 20));  // one 2 MiB segment for both
    CHECK(x->size == 512 && y->size == 1024);          // rounded up to 512 bytes
    CHECK(x->ptr != y->ptr);
    MemoryStats s = a.Stats();
    CHECK(s.allocated == 1536 && s.reserved == (2 << 20) && Balanced(s));
    void* xp = x->ptr;
    a.Free(x);
    MemoryBlock* z = a.Allocate(300, kStream);  // the freed block, for the same stream, at once
    CHECK(z->ptr == xp && raw.allocs == 1);
    a.Free(z);
    a.Free(y);
    s = a.Stats();
    CHECK(s.allocated == 0 && s.cached == (2 << 20) && Balanced(s));  // the neighbours merged back whole
    MemoryBlock* whole = a.Allocate(1 << 20, kStream);                // fits only if they merged
    CHECK(raw.allocs == 1);
    a.Free(whole);
    a.EmptyCache();
    CHECK(raw.frees == 1 && raw.held == 0 && a.Stats().reserved == 0);
}

void TestLargeBlocksAndPeaks() {
    Raw raw;
    CachingAllocator& a = *Make(raw, "test:large");
    MemoryBlock* b = a.Allocate(3 << 20, kStream);  // under 10 MiB: a 20 MiB segment, split
    CHECK(raw.allocs == 1 && raw.held == (20u << 20) && b->size == (3u << 20));
    MemoryBlock* c = a.Allocate(30 << 20, kStream);  // its own segment, as large as asked (rounded)
    CHECK(raw.allocs == 2 && raw.held == (50u << 20));
    MemoryStats s = a.Stats();
    CHECK(s.peak_allocated == (33 << 20) && s.num_allocs == 2 && Balanced(s));
    a.Free(c);
    a.ResetPeak();
    CHECK(a.Stats().peak_allocated == (3 << 20));
    a.Free(b);
    a.EmptyCache();
    CHECK(raw.held == 0 && raw.frees == 2);
}

void TestOutOfMemoryRetriesThenNamesTheRequest() {
    Raw raw;
    raw.limit = 21u << 20;
    CachingAllocator& a = *Make(raw, "test:oom");
    MemoryBlock* small = a.Allocate(512, kStream);  // a 2 MiB segment
    a.Free(small);                                  // cached: 2 MiB held, none allocated
    // A 20 MiB segment does not fit beside it: the cache goes back to the runtime and the retry fits.
    MemoryBlock* big = a.Allocate(3 << 20, kStream);
    CHECK(big != nullptr && raw.frees == 1 && raw.held == (20u << 20) && a.Stats().num_ooms == 0);
    CHECK_THROWS(a.Allocate(30 << 20, kStream), OutOfMemoryError, "test:oom: out of memory allocating 31457280 bytes");
    CHECK(a.Stats().num_ooms == 1 && Balanced(a.Stats()));
    MemoryBlock* rest = a.Allocate(8 << 20, kStream);  // the 20 MiB segment's free remainder still serves
    CHECK(raw.allocs == 2);
    a.Free(rest);
    a.Free(big);
    a.EmptyCache();
    CHECK(raw.held == 0);
}

}  // namespace

int main() {
    TestSmallBlocksShareASegmentAndComeBack();
    TestLargeBlocksAndPeaks();
    TestOutOfMemoryRetriesThenNamesTheRequest();
    return ::infinitrain::testing::Failures();
}
