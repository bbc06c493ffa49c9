// Standalone check of backends/gpu/foreach.cuh, beyond what the op suites reach. On the host (no GPU needed):
//   - the launch layout of ForEachBatch and ForeachChunkOf: over every block of every launch, each element of each
//     tensor is covered once, blocks follow (tensor, chunk) order, chunks start at multiples of kForeachChunk of
//     their tensor, launches hold at most kSlots pieces and kMaxBlocks blocks, and the kPtrs pointers of a piece
//     agree; for mixed sizes and tensors of more than kMaxBlocks chunks (no memory behind the pointers);
// on the GPU:
//   - foreach_adamw_'s kernel against adamw_'s (AdamWKernel, one launch per tensor), bit for bit, several steps;
//   - foreach_sum_squares against a float64 host sum, and the same bits under another launch split (3 pieces a
//     launch instead of 64);
//   - foreach_mul_ against the host's float product rounded once, bit for bit;
// for every float dtype, over mixed sizes (empty, odd, around the 16384-element chunk, 100 small tensors) and,
// with --big, one tensor of more than kMaxBlocks chunks (2^30 + 12345 elements), which spans two launches.
//   foreach_check [--big]   the layout, then the GPU checks
//   foreach_check --layout  the layout only
// Prints one line per case and PASS/FAIL; exits 1 on any FAIL.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/gpu/foreach.cuh"

using namespace infinitrain::gpu;

namespace {

#define CHECK_CUDA(x)                                                                               \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(2);                                                                           \
        }                                                                                           \
    } while (0)

int failures = 0;

void Report(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    if (!ok) ++failures;
}

// Host values of the storage types.
double ToD(float v) { return v; }
double ToD(double v) { return v; }
double ToD(bf16_t v) { return __bfloat162float(v); }
double ToD(fp16_t v) { return __half2float(v); }
template <typename T>
T FromF(float f);
template <>
float FromF<float>(float f) {
    return f;
}
template <>
double FromF<double>(float f) {
    return f;
}
template <>
bf16_t FromF<bf16_t>(float f) {
    return __float2bfloat16_rn(f);
}
template <>
fp16_t FromF<fp16_t>(float f) {
    return __float2half_rn(f);
}
template <typename T>
const char* Name();
template <>
const char* Name<float>() {
    return "float32";
}
template <>
const char* Name<double>() {
    return "float64";
}
template <>
const char* Name<bf16_t>() {
    return "bfloat16";
}
template <>
const char* Name<fp16_t>() {
    return "float16";
}

// A device array with its host copy.
template <typename T>
struct Buf {
    std::vector<T> host;
    T* dev = nullptr;
    explicit Buf(int64_t n) : host(n) { CHECK_CUDA(cudaMalloc(&dev, std::max<int64_t>(n, 1) * sizeof(T))); }
    Buf(const Buf&) = delete;
    ~Buf() { cudaFree(dev); }
    void Up() { CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice)); }
    std::vector<T> Down() const {
        std::vector<T> h(host.size());
        CHECK_CUDA(cudaMemcpy(h.data(), dev, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

template <typename T>
bool SameBytes(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::mt19937_64 rng(std::random_device{}());

// Fast uniform-ish values in [-scale, scale) for big tensors (the distribution does not matter here).
template <typename T>
void Fill(std::vector<T>& v, float scale, float offset = 0.0f) {
    uint64_t s = rng() | 1;
    for (auto& e : v) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        e = FromF<T>(offset + scale * (static_cast<float>(s >> 40) * 0x1p-23f - 1.0f));
    }
}

std::vector<int64_t> Sizes(bool big) {
    std::vector<int64_t> n = {1, 0, 21, 2145, 4099, 16383, 16384, 16385, 40000, 0, 3};
    std::uniform_int_distribution<int64_t> small(0, 300);
    for (int k = 0; k < 100; ++k) n.push_back(small(rng));
    if (big) n.push_back((int64_t{1} << 30) + 12345);
    return n;
}

template <typename T>
using Bufs = std::vector<std::unique_ptr<Buf<T>>>;

// Walks every block of every launch of ForEachBatch<kPtrs, kSlots> over tensors of n[t] elements, at fake
// addresses: pointer k of tensor t at kBase * (k + 1) + (elements before t) * bytes[k].
template <int kPtrs, int kSlots>
bool CheckLayout(const std::vector<int64_t>& n, const std::array<int64_t, kPtrs>& bytes) {
    constexpr uint64_t kBase = uint64_t{1} << 44;
    std::vector<int64_t> start(n.size() + 1, 0);
    for (size_t t = 0; t < n.size(); ++t) start[t + 1] = start[t] + n[t];
    std::vector<std::array<void*, kPtrs>> ptrs(n.size());
    for (size_t t = 0; t < n.size(); ++t) {
        for (int k = 0; k < kPtrs; ++k) {
            ptrs[t][k] = reinterpret_cast<void*>(kBase * (k + 1) + static_cast<uint64_t>(start[t] * bytes[k]));
        }
    }
    bool ok = true;
    int64_t next = 0, expected_base = 0;  // next: the element (over all tensors) the next block must start at
    ForEachBatch<kPtrs, kSlots>(
        ptrs, n, bytes, [&](const ForeachBatch<kPtrs, kSlots>& batch, int64_t blocks, int64_t base) {
            ok = ok && base == expected_base && blocks >= 1 && blocks <= kMaxBlocks && batch.count >= 1 &&
                 batch.count <= kSlots && batch.first[0] == 0 && batch.first[batch.count] == blocks;
            expected_base += blocks;
            for (int32_t b = 0; ok && b < blocks; ++b) {
                int64_t begin, end;
                const int s = ForeachChunkOf(batch, b, begin, end);
                const uint64_t p0 = reinterpret_cast<uint64_t>(batch.ptr[0][s]) - kBase;
                const int64_t at = static_cast<int64_t>(p0 / bytes[0]) + begin;  // over all tensors
                for (int k = 1; k < kPtrs; ++k) {
                    ok = ok &&
                         reinterpret_cast<uint64_t>(batch.ptr[k][s]) - kBase * (k + 1) == (p0 / bytes[0]) * bytes[k];
                }
                // The tensor holding element `next` (empty tensors have none).
                size_t t = 0;
                while (t + 1 < start.size() && start[t + 1] <= next) ++t;
                const int64_t want_end =
                    std::min(start[t + 1], next - (next - start[t]) % kForeachChunk + kForeachChunk);
                ok = ok && at == next && (at - start[t]) % kForeachChunk == 0 && at + (end - begin) == want_end &&
                     end > begin;
                next = at + (end - begin);
            }
        });
    return ok && next == start.back() && expected_base == ForeachBlocks(n);
}

void CheckLayouts() {
    std::vector<int64_t> mixed = {1, 0, 21, 16383, 16384, 16385, 40000, 0, 3};
    std::uniform_int_distribution<int64_t> small(0, 300);
    for (int k = 0; k < 200; ++k) mixed.push_back(small(rng));
    const int64_t over = kMaxBlocks * kForeachChunk;  // one launch's elements
    const std::vector<std::vector<int64_t>> cases = {
        mixed, {0}, {0, 0, 0}, {5}, {over}, {over + 1}, {3, over - 1, 2 * over + 7, 0, 16385}, {over * 3 + 12345}};
    bool ok = true;
    for (const auto& n : cases) {
        ok = ok && CheckLayout<1, 64>(n, {4}) && CheckLayout<1, 3>(n, {2}) && CheckLayout<4, 32>(n, {2, 2, 4, 4}) &&
             CheckLayout<4, 1>(n, {8, 8, 8, 8});
    }
    Report(ok, "launch layout: every element once, in (tensor, chunk) order, within the slot and block limits");
}

// {float64 result, float32 result, launches} of foreach_sum_squares in launches of kSlots pieces.
template <int kSlots, typename T>
std::vector<double> SumSquares(const Bufs<T>& xs) {
    std::vector<std::array<void*, 1>> ptrs;
    std::vector<int64_t> n;
    for (const auto& x : xs) {
        ptrs.push_back({x->dev});
        n.push_back(static_cast<int64_t>(x->host.size()));
    }
    const int64_t blocks = ForeachBlocks(n);
    double *partial, *out64;
    float* out32;
    CHECK_CUDA(cudaMalloc(&partial, std::max<int64_t>(blocks, 1) * sizeof(double)));
    CHECK_CUDA(cudaMalloc(&out64, sizeof(double)));
    CHECK_CUDA(cudaMalloc(&out32, sizeof(float)));
    int launches = 0;
    ForEachBatch<1, kSlots>(ptrs, n, {sizeof(T)},
                            [&](const ForeachBatch<1, kSlots>& batch, int64_t nblocks, int64_t base) {
                                ForeachSumSquaresKernel<T, ForeachBatch<1, kSlots>>
                                    <<<static_cast<unsigned>(nblocks), kThreads>>>(batch, partial, base);
                                CHECK_CUDA(cudaGetLastError());
                                ++launches;
                            });
    SumPartialsKernel<double><<<1, 1024>>>(partial, blocks, out64);
    SumPartialsKernel<float><<<1, 1024>>>(partial, blocks, out32);
    CHECK_CUDA(cudaGetLastError());
    double r64;
    float r32;
    CHECK_CUDA(cudaMemcpy(&r64, out64, sizeof(double), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&r32, out32, sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(partial), cudaFree(out64), cudaFree(out32);
    return {r64, static_cast<double>(r32), static_cast<double>(launches)};
}

template <typename T>
void CheckSumSquares(bool big) {
    std::vector<int64_t> sizes = Sizes(big);
    Bufs<T> xs;
    double ref = 0.0;
    for (int64_t n : sizes) {
        xs.push_back(std::make_unique<Buf<T>>(n));
        Fill(xs.back()->host, 3.0f);
        xs.back()->Up();
        for (const T& v : xs.back()->host) ref += ToD(v) * ToD(v);
    }
    const std::vector<double> a = SumSquares<64>(xs), b = SumSquares<3>(xs);
    const double err = std::fabs(a[0] - ref) / ref;
    const bool split_same = std::memcmp(&a[0], &b[0], sizeof(double)) == 0 && a[1] == b[1];
    char line[256];
    std::snprintf(line, sizeof(line),
                  "foreach_sum_squares %s, %zu tensors: rel. error %.2e; %d and %d launches give the same bits: %s",
                  Name<T>(), sizes.size(), err, static_cast<int>(a[2]), static_cast<int>(b[2]),
                  split_same ? "yes" : "no");
    Report(err < 1e-12 && split_same && a[1] == static_cast<double>(static_cast<float>(a[0])), line);
}

template <typename T, typename S>
void CheckMul(bool big) {
    std::vector<int64_t> sizes = Sizes(big);
    Bufs<T> xs;
    std::vector<std::array<void*, 1>> ptrs;
    for (int64_t n : sizes) {
        xs.push_back(std::make_unique<Buf<T>>(n));
        Fill(xs.back()->host, 2.0f);
        xs.back()->Up();
        ptrs.push_back({xs.back()->dev});
    }
    Buf<S> scale(1);
    scale.host[0] = FromF<S>(std::uniform_real_distribution<float>(0.1f, 3.0f)(rng));
    scale.Up();
    ForEachBatch<1, 64>(ptrs, sizes, {sizeof(T)}, [&](const ForeachBatch1& batch, int64_t nblocks, int64_t) {
        ForeachMulKernel<T, S><<<static_cast<unsigned>(nblocks), kThreads>>>(batch, scale.dev);
        CHECK_CUDA(cudaGetLastError());
    });
    using V = Acc<T>;
    const V c = static_cast<V>(ToD(scale.host[0]));
    bool ok = true;
    for (const auto& x : xs) {
        std::vector<T> got = x->Down(), want(x->host.size());
        for (size_t i = 0; i < want.size(); ++i) {
            const V p = static_cast<V>(ToD(x->host[i])) * c;
            want[i] = std::is_same<T, double>::value ? static_cast<T>(p) : FromF<T>(static_cast<float>(p));
        }
        ok = ok && SameBytes(got, want);
    }
    Report(ok, std::string("foreach_mul_ ") + Name<T>() + " by a " + Name<S>() + " scale, bit for bit");
}

template <typename T>
void CheckAdamW(bool big) {
    using S = Acc<T>;
    std::vector<int64_t> sizes = Sizes(big);
    const size_t n = sizes.size();
    Bufs<T> p1, p2, g;  // 1: foreach_adamw_'s, 2: adamw_'s
    Bufs<S> m1, m2, v1, v2;
    std::vector<std::array<void*, 4>> ptrs;
    for (int64_t e : sizes) {
        for (Bufs<T>* b : {&p1, &p2, &g}) b->push_back(std::make_unique<Buf<T>>(e));
        for (Bufs<S>* b : {&m1, &m2, &v1, &v2}) b->push_back(std::make_unique<Buf<S>>(e));
        Fill(p1.back()->host, 1.0f);
        p2.back()->host = p1.back()->host;
        Fill(m1.back()->host, 0.1f);
        m2.back()->host = m1.back()->host;
        Fill(v1.back()->host, 0.05f, 0.05f);  // v > 0
        v2.back()->host = v1.back()->host;
        for (Bufs<T>* b : {&p1, &p2}) b->back()->Up();
        for (Bufs<S>* b : {&m1, &m2, &v1, &v2}) b->back()->Up();
        ptrs.push_back({p1.back()->dev, g.back()->dev, m1.back()->dev, v1.back()->dev});
    }
    bool ok = true;
    for (int step = 1; step <= 3; ++step) {
        for (const auto& b : g) {
            Fill(b->host, 0.5f);
            b->Up();
        }
        const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
        const AdamWParams h{lr, b1, b2, eps, 1.0 - lr * wd, 1.0 - std::pow(b1, step), 1.0 - std::pow(b2, step)};
        ForEachBatch<4, 32>(ptrs, sizes, {sizeof(T), sizeof(T), sizeof(S), sizeof(S)},
                            [&](const ForeachBatch4& batch, int64_t nblocks, int64_t) {
                                ForeachAdamWKernel<T><<<static_cast<unsigned>(nblocks), kThreads>>>(batch, h);
                                CHECK_CUDA(cudaGetLastError());
                            });
        for (size_t k = 0; k < n; ++k) {
            if (sizes[k] == 0) continue;
            AdamWKernel<T><<<Blocks(sizes[k]), kThreads>>>(p2[k]->dev, g[k]->dev, m2[k]->dev, v2[k]->dev, sizes[k], h);
            CHECK_CUDA(cudaGetLastError());
        }
        for (size_t k = 0; k < n; ++k) {
            ok = ok && SameBytes(p1[k]->Down(), p2[k]->Down()) && SameBytes(m1[k]->Down(), m2[k]->Down()) &&
                 SameBytes(v1[k]->Down(), v2[k]->Down());
        }
    }
    // The steps moved the params (a kernel that did nothing would match a kernel that did nothing).
    bool moved = false;
    for (size_t k = 0; k < n && !moved; ++k) moved = sizes[k] > 0 && !SameBytes(p1[k]->Down(), p1[k]->host);
    Report(ok && moved,
           std::string("foreach_adamw_ ") + Name<T>() + ", " + std::to_string(n) + " sets, 3 steps: adamw_'s bits");
}

// The big tensor (--big) in one case of each op and dtype, and in adamw for 16-bit params only (device memory and
// host time).
template <typename T>
void CheckDtype(bool big) {
    CheckSumSquares<T>(big);
    CheckMul<T, float>(big);
    CheckMul<T, double>(false);
    CheckMul<T, bf16_t>(false);
    CheckMul<T, fp16_t>(false);
    CheckAdamW<T>(big && sizeof(T) == 2);
}

}  // namespace

int main(int argc, char** argv) {
    const bool big = argc > 1 && std::strcmp(argv[1], "--big") == 0;
    CheckLayouts();
    if (argc > 1 && std::strcmp(argv[1], "--layout") == 0) return failures ? 1 : 0;
    CheckDtype<float>(big);
    CheckDtype<double>(big);
    CheckDtype<bf16_t>(big);
    CheckDtype<fp16_t>(big);
    std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
