// bfloat16 GEMM kernels (bf16_gemm.h). Both operands are packed first, zero-padded: A in blocks of 32 rows by
// Kp = K rounded up to 32 (row-major), B in panels of 16 columns with each pair of k values side by side
// ([Kp / 2][16][2], the layout AMX's B tile and vdpbf16ps's operand read). A block times two panels gives a 32 x 32
// block of C summed over all of K in registers or tiles, then C = alpha * sum + beta * C. Zero padding adds exact
// zeros, so the tails need no special cases.

#include "infinitrain/kernels/cpu/bf16_gemm.h"

#include <omp.h>

#include "infinitrain/dtype.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace infinitrain::cpu {
namespace {

enum class Kernel { kGeneric, kAvx512, kAmx };

constexpr int64_t kMr = 32;  // rows of A per block
constexpr int64_t kNr = 16;  // columns of B per panel
constexpr int64_t kKr = 32;  // K is padded to a multiple of this (one AMX tile's depth)

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

#if defined(__x86_64__)
uint64_t Xgetbv0() {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t{hi} << 32) | lo;
}

// AMX needs the CPU's AMX-TILE and AMX-BF16 (CPUID.(7,0):EDX bits 24 and 22), the OS saving the tile state (XCR0
// bits 17 and 18) and, on Linux, the process's permission to use it (arch_prctl, kernel 5.16+); without the last,
// the first tile instruction faults.
bool AmxUsable() {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid(1, a, b, c, d);
    if (!(c & (1u << 27))) return false;  // OSXSAVE: xgetbv is allowed
    __cpuid_count(7, 0, a, b, c, d);
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;
    if ((Xgetbv0() & (3u << 17)) != (3u << 17)) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

// Whether this CPU (and OS) runs kernel k; the AMX check, which asks the OS for the tile state, runs once.
bool Runs(Kernel k) {
#if defined(__x86_64__)
    static const bool amx = AmxUsable();
    // GCC's check covers CPUID.(7,1):EAX bit 5 and the OS saving the AVX-512 state.
    static const bool avx512 = (__builtin_cpu_init(), __builtin_cpu_supports("avx512bf16") != 0);
    if (k == Kernel::kAmx) return amx;
    if (k == Kernel::kAvx512) return avx512;
#else
    if (k != Kernel::kGeneric) return false;
#endif
    return true;
}

Kernel Best() { return Runs(Kernel::kAmx) ? Kernel::kAmx : Runs(Kernel::kAvx512) ? Kernel::kAvx512 : Kernel::kGeneric; }

const char* KernelName(Kernel k) { return k == Kernel::kAmx ? "amx" : k == Kernel::kAvx512 ? "avx512bf16" : "generic"; }

struct Choice {
    bool use;       // bfloat16 GEMMs take these kernels
    Kernel kernel;  // and run this one
};

// INFINITRAIN_CPU_BF16_GEMM, read once. Besides auto, sbgemm and widen, amx, avx512bf16 and generic force one kernel
// (for tests and benchmarks); one the CPU cannot run is refused.
Choice ReadChoice() {
    const char* e = std::getenv("INFINITRAIN_CPU_BF16_GEMM");
    std::string v = e ? e : "";
    Kernel best = Best();
    // AVX512_BF16 alone is not taken: forced on an AMX CPU, that kernel ran slower than sgemm (docs/benchmarks.md).
    if (v.empty() || v == "auto") return {best == Kernel::kAmx, best};
    if (v == "sbgemm") return {true, best};
    if (v == "widen") return {false, best};
    for (Kernel k : {Kernel::kAmx, Kernel::kAvx512, Kernel::kGeneric}) {
        if (v != KernelName(k)) continue;
        if (!Runs(k)) {
            throw std::invalid_argument("INFINITRAIN_CPU_BF16_GEMM='" + v +
                                        "': this CPU cannot run that kernel (its best bf16 kernel is '" +
                                        KernelName(best) + "')");
        }
        return {true, k};
    }
    throw std::invalid_argument("INFINITRAIN_CPU_BF16_GEMM='" + v +
                                "': expected 'auto' (the default), 'sbgemm', 'widen', or a kernel: 'amx', "
                                "'avx512bf16', 'generic'");
}

const Choice& GetChoice() {
    static const Choice c = ReadChoice();  // a throw leaves it unset, so every later call throws again
    return c;
}

// ---- packing -------------------------------------------------------------------------------------------------

// op(A)'s rows [r0, r0 + 32) into dst [32][kp], zero past m and k.
void PackA(bool ta, int64_t m, int64_t k, const uint16_t* a, int64_t lda, int64_t r0, int64_t kp, uint16_t* dst) {
    int64_t rows = m - r0 < kMr ? m - r0 : kMr;
    if (!ta) {
        for (int64_t i = 0; i < rows; ++i) {
            std::memcpy(dst + i * kp, a + (r0 + i) * lda, k * sizeof(uint16_t));
            std::memset(dst + i * kp + k, 0, (kp - k) * sizeof(uint16_t));
        }
    } else {
        // 32 x 32 squares through a local tile: the rows of dst lie kp apart, often a multiple of 4 KiB, so
        // writing them an element at a time thrashes a few cache sets.
        uint16_t tile[kMr][kKr];
        for (int64_t k0 = 0; k0 < kp; k0 += kKr) {
            int64_t kn = k - k0 < kKr ? k - k0 : kKr;
            for (int64_t j = 0; j < kKr; ++j) {
                if (j < kn) {
                    const uint16_t* src = a + (k0 + j) * lda + r0;
                    for (int64_t i = 0; i < rows; ++i) tile[i][j] = src[i];
                } else {
                    for (int64_t i = 0; i < rows; ++i) tile[i][j] = 0;
                }
            }
            for (int64_t i = 0; i < rows; ++i) std::memcpy(dst + i * kp + k0, tile[i], sizeof tile[i]);
        }
    }
    std::memset(dst + rows * kp, 0, (kMr - rows) * kp * sizeof(uint16_t));
}

// op(B)'s columns [c0, c0 + 16) into dst [kp / 2][16][2], zero past n and k.
void PackB(bool tb, int64_t n, int64_t k, const uint16_t* b, int64_t ldb, int64_t c0, int64_t kp, uint16_t* dst) {
    int64_t cols = n - c0 < kNr ? n - c0 : kNr;
    // Zeros where no value lands: every column past n, else the k pairs past k / 2.
    int64_t from = cols < kNr ? 0 : (k / 2) * 2 * kNr;
    std::memset(dst + from, 0, (kp * kNr - from) * sizeof(uint16_t));
    if (tb) {
        // op(B)[kk][c] = b[c * ldb + kk]: each column of op(B) is a row of b, whose k pairs are 32-bit words.
        for (int64_t c = 0; c < cols; ++c) {
            const uint16_t* src = b + (c0 + c) * ldb;
            for (int64_t r = 0; r < k / 2; ++r) {
                uint32_t w;
                std::memcpy(&w, src + 2 * r, sizeof w);
                std::memcpy(dst + (r * kNr + c) * 2, &w, sizeof w);
            }
            if (k & 1) dst[(k / 2) * 2 * kNr + c * 2] = src[k - 1];
        }
    } else {
        for (int64_t kk = 0; kk < k; ++kk) {
            const uint16_t* src = b + kk * ldb + c0;
            uint16_t* row = dst + (kk >> 1) * 2 * kNr + (kk & 1);
            for (int64_t c = 0; c < cols; ++c) row[c * 2] = src[c];
        }
    }
}

// ---- micro-kernels: out[32][np * 16] (row stride ldo) = (accumulate ? out : 0) + A block (32 x kp) @ np panels ------

inline float Bf16(uint16_t h) {
    uint32_t u = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

void MicroGeneric(const uint16_t* ap, const uint16_t* bp, int np, int64_t kp, float* out, int64_t ldo,
                  bool accumulate) {
    for (int p = 0; p < np; ++p) {
        const uint16_t* panel = bp + p * kp * kNr;
        for (int64_t i = 0; i < kMr; ++i) {
            float row[kNr] = {};
            const uint16_t* ar = ap + i * kp;
            for (int64_t r = 0; r < kp / 2; ++r) {
                float a0 = Bf16(ar[2 * r]), a1 = Bf16(ar[2 * r + 1]);
                const uint16_t* br = panel + r * 2 * kNr;
                for (int64_t c = 0; c < kNr; ++c) {
                    row[c] += a0 * Bf16(br[2 * c]);
                    row[c] += a1 * Bf16(br[2 * c + 1]);
                }
            }
            float* o = out + i * ldo + p * kNr;
            for (int64_t c = 0; c < kNr; ++c) o[c] = accumulate ? o[c] + row[c] : row[c];
        }
    }
}

#if defined(__x86_64__)
// 8 rows at a time: 16 accumulators, one broadcast pair of A per row and k pair against two panel rows. The row
// loops are unrolled so that the accumulators live in registers.
__attribute__((target("avx512f,avx512bf16"))) void MicroAvx512(const uint16_t* ap, const uint16_t* bp, int np,
                                                               int64_t kp, float* out, int64_t ldo, bool accumulate) {
    const uint16_t* b1 = bp + (np > 1 ? kp * kNr : 0);  // one panel: the second product is computed and dropped
    for (int64_t i0 = 0; i0 < kMr; i0 += 8) {
        __m512 c0[8], c1[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
        const uint16_t* ar = ap + i0 * kp;
        for (int64_t r = 0; r < kp / 2; ++r) {
            __m512bh x0 = (__m512bh)_mm512_loadu_si512(bp + r * 2 * kNr);
            __m512bh x1 = (__m512bh)_mm512_loadu_si512(b1 + r * 2 * kNr);
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
                int32_t pair;
                std::memcpy(&pair, ar + i * kp + 2 * r, sizeof pair);
                __m512bh y = (__m512bh)_mm512_set1_epi32(pair);
                c0[i] = _mm512_dpbf16_ps(c0[i], y, x0);
                c1[i] = _mm512_dpbf16_ps(c1[i], y, x1);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
            float* o = out + (i0 + i) * ldo;
            if (accumulate) c0[i] = _mm512_add_ps(c0[i], _mm512_loadu_ps(o));
            _mm512_storeu_ps(o, c0[i]);
            if (np > 1) {
                if (accumulate) c1[i] = _mm512_add_ps(c1[i], _mm512_loadu_ps(o + 16));
                _mm512_storeu_ps(o + 16, c1[i]);
            }
        }
    }
}

// The tile layout for every AMX call: tiles 0-3 C (16 x 16 float), 4-5 A (16 rows x 32 bf16), 6-7 B (16 k pairs x 16
// columns x 2). It is per thread: loaded by each thread before its first product, released after its last.
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

__attribute__((target("amx-tile"))) void AmxBegin() {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    // GCC does not see ldtilecfg read the whole struct and drops the stores above without this barrier.
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) void AmxEnd() { _tile_release(); }

// The accumulator tiles start from out itself when accumulating (a tile load), so C is read and written once.
__attribute__((target("amx-tile,amx-bf16"))) void MicroAmx(const uint16_t* ap, const uint16_t* bp, int np, int64_t kp,
                                                           float* out, int64_t ldo, bool accumulate) {
    const uint16_t *a1 = ap + 16 * kp, *b1 = bp + kp * kNr;
    const int64_t stride = kp * sizeof(uint16_t), cs = ldo * sizeof(float);
    float *o1 = out + 16, *o2 = out + 16 * ldo, *o3 = o2 + 16;
    if (accumulate) {
        _tile_loadd(0, out, cs);
        _tile_loadd(2, o2, cs);
    } else {
        _tile_zero(0);
        _tile_zero(2);
    }
    if (np > 1) {
        if (accumulate) {
            _tile_loadd(1, o1, cs);
            _tile_loadd(3, o3, cs);
        } else {
            _tile_zero(1);
            _tile_zero(3);
        }
        for (int64_t kk = 0; kk < kp; kk += kKr) {
            _tile_loadd(4, ap + kk, stride);
            _tile_loadd(5, a1 + kk, stride);
            _tile_loadd(6, bp + kk * kNr, 64);
            _tile_loadd(7, b1 + kk * kNr, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(1, o1, cs);
        _tile_stored(3, o3, cs);
    } else {
        for (int64_t kk = 0; kk < kp; kk += kKr) {
            _tile_loadd(4, ap + kk, stride);
            _tile_loadd(5, a1 + kk, stride);
            _tile_loadd(6, bp + kk * kNr, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
        }
    }
    _tile_stored(0, out, cs);
    _tile_stored(2, o2, cs);
}
#endif

void Micro(Kernel kern, const uint16_t* ap, const uint16_t* bp, int np, int64_t kp, float* out, int64_t ldo,
           bool accumulate) {
#if defined(__x86_64__)
    if (kern == Kernel::kAmx) return MicroAmx(ap, bp, np, kp, out, ldo, accumulate);
    if (kern == Kernel::kAvx512) return MicroAvx512(ap, bp, np, kp, out, ldo, accumulate);
#endif
    MicroGeneric(ap, bp, np, kp, out, ldo, accumulate);
}

// ---- driver --------------------------------------------------------------------------------------------------

// 64-byte aligned scratch (AMX tile rows and vector loads stay within cache lines). Each thread keeps its last
// buffers of up to kKeepBytes for the next call: fresh ones of megabytes come from mmap and cost a page fault per
// 4 KiB, as much as the packing itself.
constexpr size_t kKeepBytes = size_t{32} << 20;

struct Kept {
    void* p = nullptr;
    size_t bytes = 0;
    ~Kept() { std::free(p); }
};

class Buffer {
public:
    Buffer(int64_t elems, Kept& kept) : kept_(kept) {
        size_t bytes = static_cast<size_t>(RoundUp(elems * int64_t{sizeof(uint16_t)}, 64));
        if (bytes == 0) bytes = 64;
        if (kept.p && kept.bytes >= bytes) {
            p = static_cast<uint16_t*>(kept.p);  // borrowed until the destructor hands it back
            kept.p = nullptr;
            size_ = kept.bytes;
            return;
        }
        p = static_cast<uint16_t*>(std::aligned_alloc(64, bytes));
        if (!p) throw std::bad_alloc();
        size_ = bytes;
    }
    ~Buffer() {  // kept: this one, the larger (a smaller kept one was not borrowed)
        if (size_ <= kKeepBytes) {
            std::free(kept_.p);
            kept_.p = p;
            kept_.bytes = size_;
        } else {
            std::free(p);
        }
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    uint16_t* p;

private:
    Kept& kept_;
    size_t size_;
};

thread_local Kept kept_a, kept_b;

struct Problem {
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc, kp, blocks, panels;
    float alpha, beta;
    const uint16_t *a, *b;
    float* c;                               // float32 C, or
    uint16_t* cbf;                          // bfloat16 C (beta 0),
    const uint16_t* bias;                   // with this bfloat16 [N] row added before rounding (may be null)
    uint16_t *pa = nullptr, *pb = nullptr;  // packed A (blocks x 32 x kp) and B (panels x kp x 16)
};

// Panels of B per pass over A: a chunk of about 512 KiB stays in L2 while every A block of the rows passes by.
int64_t PanelsPerChunk(int64_t kp) {
    int64_t p = (int64_t{512} << 10) / (kp * kNr * int64_t{sizeof(uint16_t)});
    return p < 2 ? 2 : p & ~int64_t{1};
}

// out[i][j] = bfloat16(alpha * acc[i][j] + bias[j]) for a rows x cols block (acc's row stride 32, out's ldo), with
// FloatToBF16's rounding.
void RoundBlock(const float* acc, const float* bias, float alpha, int64_t rows, int64_t cols, uint16_t* out,
                int64_t ldo) {
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) out[i * ldo + j] = FloatToBF16(alpha * acc[i * 32 + j] + bias[j]);
    }
}

#if defined(__x86_64__)
// The same 16 lanes at a time where the CPU has AVX-512 (every AMX or AVX512_BF16 CPU): a scalar loop rounds more
// slowly than the bf16 kernels produce a block. (The maskz shifts: GCC 12 warns on the plain ones' undefined
// operand.)
__attribute__((target("avx512f"))) void RoundBlockAvx512(const float* acc, const float* bias, float alpha, int64_t rows,
                                                         int64_t cols, uint16_t* out, int64_t ldo) {
    const __m512 va = _mm512_set1_ps(alpha);
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
    const __mmask16 all = 0xffff;
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; j += 16) {
            __mmask16 m = cols - j >= 16 ? all : __mmask16((1u << (cols - j)) - 1);
            __m512 v = _mm512_add_ps(_mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, acc + i * 32 + j)),
                                     _mm512_maskz_loadu_ps(m, bias + j));
            __m512i u = _mm512_castps_si512(v), hi = _mm512_maskz_srli_epi32(all, u, 16);
            __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(hi, one)));
            r = _mm512_maskz_srli_epi32(all, r, 16);
            r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_or_si512(hi, quiet));
            _mm512_mask_cvtepi32_storeu_epi16(out + i * ldo + j, m, r);
        }
    }
}
#endif

// Writes acc's rows x cols block (row stride 32) to C at row r0, column c0.
void Epilogue(const Problem& pr, const float* acc, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
    if (pr.cbf) {
        float bias[32] = {};
        if (pr.bias) {
            for (int64_t j = 0; j < cols; ++j) bias[j] = BF16ToFloat(pr.bias[c0 + j]);
        }
#if defined(__x86_64__)
        static const bool avx512 = __builtin_cpu_supports("avx512f");
        if (avx512) {
            RoundBlockAvx512(acc, bias, pr.alpha, rows, cols, pr.cbf + r0 * pr.ldc + c0, pr.ldc);
            return;
        }
#endif
        RoundBlock(acc, bias, pr.alpha, rows, cols, pr.cbf + r0 * pr.ldc + c0, pr.ldc);
        return;
    }
    for (int64_t i = 0; i < rows; ++i) {
        const float* sr = acc + i * 32;
        float* cr = pr.c + (r0 + i) * pr.ldc + c0;
        if (pr.beta == 0.0f) {
            for (int64_t j = 0; j < cols; ++j) cr[j] = pr.alpha * sr[j];
        } else {
            for (int64_t j = 0; j < cols; ++j) cr[j] = pr.alpha * sr[j] + pr.beta * cr[j];
        }
    }
}

// C's rows of A blocks [b0, b1) against all of packed B.
void ComputeRows(const Problem& pr, Kernel kern, int64_t b0, int64_t b1) {
    alignas(64) float acc[kMr * 32];
    int64_t chunk = PanelsPerChunk(pr.kp);
    // Whole blocks of a float32 C with alpha 1 and beta 0 or 1 go straight into C; the rest through acc.
    const bool direct = pr.c && pr.alpha == 1.0f && (pr.beta == 0.0f || pr.beta == 1.0f);
#if defined(__x86_64__)
    if (kern == Kernel::kAmx) AmxBegin();
#endif
    for (int64_t p0 = 0; p0 < pr.panels; p0 += chunk) {
        int64_t p1 = p0 + chunk < pr.panels ? p0 + chunk : pr.panels;
        for (int64_t blk = b0; blk < b1; ++blk) {
            const uint16_t* ap = pr.pa + blk * kMr * pr.kp;
            int64_t r0 = blk * kMr, rows = pr.m - r0 < kMr ? pr.m - r0 : kMr;
            for (int64_t p = p0; p < p1; p += 2) {
                int np = p + 1 < p1 ? 2 : 1;
                int64_t c0 = p * kNr, cols = pr.n - c0 < np * kNr ? pr.n - c0 : np * kNr;
                const uint16_t* bp = pr.pb + p * pr.kp * kNr;
                if (direct && rows == kMr && cols == np * kNr) {
                    Micro(kern, ap, bp, np, pr.kp, pr.c + r0 * pr.ldc + c0, pr.ldc, pr.beta != 0.0f);
                } else {
                    Micro(kern, ap, bp, np, pr.kp, acc, 32, false);
                    Epilogue(pr, acc, r0, rows, c0, cols);
                }
            }
        }
    }
#if defined(__x86_64__)
    if (kern == Kernel::kAmx) AmxEnd();
#endif
}

// Packs and multiplies on `threads` threads (1: no parallel region). Scratch is allocated here, before any region.
void Run(Problem pr, int threads) {
    if (pr.m == 0 || pr.n == 0) return;
    if (pr.k == 0) {  // BLAS's K == 0: C = beta * C (or the bias alone)
        for (int64_t i = 0; i < pr.m; ++i) {
            for (int64_t j = 0; j < pr.n; ++j) {
                if (pr.cbf) {
                    pr.cbf[i * pr.ldc + j] = FloatToBF16(pr.bias ? BF16ToFloat(pr.bias[j]) : 0.0f);
                } else {
                    float* cij = pr.c + i * pr.ldc + j;
                    *cij = pr.beta == 0.0f ? 0.0f : pr.beta * *cij;
                }
            }
        }
        return;
    }
    Kernel kern = GetChoice().kernel;
    pr.kp = RoundUp(pr.k, kKr);
    pr.blocks = (pr.m + kMr - 1) / kMr;
    pr.panels = (pr.n + kNr - 1) / kNr;
    Buffer pa(pr.blocks * kMr * pr.kp, kept_a), pb(pr.panels * kNr * pr.kp, kept_b);
    pr.pa = pa.p;
    pr.pb = pb.p;
    auto pack_b = [&](int64_t p) { PackB(pr.tb, pr.n, pr.k, pr.b, pr.ldb, p * kNr, pr.kp, pr.pb + p * kNr * pr.kp); };
    auto pack_a = [&](int64_t blk) {
        PackA(pr.ta, pr.m, pr.k, pr.a, pr.lda, blk * kMr, pr.kp, pr.pa + blk * kMr * pr.kp);
    };
    if (threads == 1) {
        for (int64_t p = 0; p < pr.panels; ++p) pack_b(p);
        for (int64_t blk = 0; blk < pr.blocks; ++blk) pack_a(blk);
        ComputeRows(pr, kern, 0, pr.blocks);
        return;
    }
    // Nothing in the region throws: it only reads and writes the buffers above.
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < pr.panels; ++p) pack_b(p);
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < pr.blocks; ++blk) pack_a(blk);
        int64_t t = omp_get_thread_num(), parts = omp_get_num_threads();
        int64_t per = (pr.blocks + parts - 1) / parts, b0 = t * per, b1 = b0 + per < pr.blocks ? b0 + per : pr.blocks;
        if (b0 < b1) ComputeRows(pr, kern, b0, b1);
    }
}

// The thread count for a contiguous product: Gemm's rule.
int Threads(int64_t m, int64_t n, int64_t k) {
    int nt = omp_get_max_threads();
    bool serial = nt == 1 || omp_in_parallel() || m < 2 * nt || m * n * k < (int64_t{1} << 18);
    return serial ? 1 : nt;
}

}  // namespace

bool UseSbGemm() { return GetChoice().use; }

void SbGemmSerial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                  const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    Run({ta, tb, m, n, k, lda, ldb, ldc, 0, 0, 0, alpha, beta, a, b, c, nullptr, nullptr}, 1);
}

void SbGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, const uint16_t* b,
            float beta, float* c) {
    Run({ta, tb, m, n, k, ta ? m : k, tb ? k : n, n, 0, 0, 0, alpha, beta, a, b, c, nullptr, nullptr},
        Threads(m, n, k));
}

void SbGemmBf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, const uint16_t* b,
                const uint16_t* bias, uint16_t* c) {
    Run({ta, tb, m, n, k, ta ? m : k, tb ? k : n, n, 0, 0, 0, alpha, 0.0f, a, b, nullptr, c, bias}, Threads(m, n, k));
}

}  // namespace infinitrain::cpu
