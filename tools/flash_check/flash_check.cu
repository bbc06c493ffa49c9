// Standalone check of backends/gpu/flash_attention.cuh: forward and backward of every policy against a float64 host
// reference (naive loops) over a list of shapes, then timings of the GPT-2 and LLaMA-like shapes.
//   flash_check            all cases, then timings
//   flash_check --no-perf  cases only;  --perf-only  timings only
// Prints, per case and policy, max |device - reference| / max |reference| of out, lse, dq, dk, dv and PASS/FAIL
// (float32 1e-4, bfloat16/float16 2e-2; lse, dq and dk relative to max(max |ref|, 1)); exits 1 on any FAIL.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/gpu/flash_attention.cuh"

using infinitrain::gpu::bf16_t;
using infinitrain::gpu::FlashPolicy;
using infinitrain::gpu::fp16_t;
using infinitrain::gpu::LaunchFlashBackward;
using infinitrain::gpu::LaunchFlashForward;

namespace {

#define CHECK_CUDA(x)                                                                               \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(2);                                                                           \
        }                                                                                           \
    } while (0)

template <typename T>
T FromF(float f);
template <>
float FromF<float>(float f) {
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
double ToD(float v) { return v; }
double ToD(bf16_t v) { return __bfloat162float(v); }
double ToD(fp16_t v) { return __half2float(v); }

template <typename T>
const char* Name();
template <>
const char* Name<float>() {
    return "f32";
}
template <>
const char* Name<bf16_t>() {
    return "bf16";
}
template <>
const char* Name<fp16_t>() {
    return "f16";
}

const char* PolicyName(FlashPolicy p) {
    return p == FlashPolicy::kTileMma ? "tilemma" : p == FlashPolicy::kTileMmaStaged ? "staged" : "simt";
}

struct Case {
    bool causal;
    int B, Hq, Hkv, T, S, D;
    float qmul;  // scales q: sharper softmax rows
};

uint64_t g_seed = 0x9e3779b97f4a7c15ull;
float Uniform() {  // [-1, 1)
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((g_seed >> 40) * (1.0 / (1ull << 24))) * 2.f - 1.f;
}

template <typename T>
struct DevBuf {
    T* p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t count) : n(count) {
        CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T) + 16));
    }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    void Put(const std::vector<T>& h) {
        if (n) CHECK_CUDA(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> Get() const {
        std::vector<T> h(n);
        if (n) CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

template <typename T>
std::vector<T> Random(size_t n, float mul, std::vector<double>& exact) {
    std::vector<T> h(n);
    exact.resize(n);
    for (size_t i = 0; i < n; ++i) {
        h[i] = FromF<T>(Uniform() * mul);
        exact[i] = ToD(h[i]);
    }
    return h;
}

struct Ref {
    std::vector<double> out, lse, dq, dk, dv;
};

// Naive float64 sdpa and its gradients.
Ref Reference(const Case& c, double scale, const std::vector<double>& q, const std::vector<double>& k,
              const std::vector<double>& v, const std::vector<double>& dO) {
    const int g = c.Hq / c.Hkv, T = c.T, S = c.S, D = c.D;
    Ref r;
    r.out.assign(size_t(c.B) * c.Hq * T * D, 0.0);
    r.lse.assign(size_t(c.B) * c.Hq * T, -INFINITY);
    r.dq.assign(r.out.size(), 0.0);
    r.dk.assign(size_t(c.B) * c.Hkv * S * D, 0.0);
    r.dv.assign(r.dk.size(), 0.0);
    std::vector<double> p(S), dp(S);
    for (int b = 0; b < c.B; ++b) {
        for (int h = 0; h < c.Hq; ++h) {
            const size_t qh = (size_t(b) * c.Hq + h) * T, kh = (size_t(b) * c.Hkv + h / g) * S;
            for (int t = 0; t < T; ++t) {
                const double* qr = &q[(qh + t) * D];
                const double* gr = &dO[(qh + t) * D];
                const int n = c.causal ? std::min(S, t + 1) : S;
                if (n == 0) continue;
                double mx = -INFINITY;
                for (int s = 0; s < n; ++s) {
                    double acc = 0;
                    for (int e = 0; e < D; ++e) acc += qr[e] * k[(kh + s) * D + e];
                    p[s] = acc * scale;
                    mx = std::max(mx, p[s]);
                }
                double sum = 0;
                for (int s = 0; s < n; ++s) sum += std::exp(p[s] - mx);
                r.lse[qh + t] = mx + std::log(sum);
                for (int s = 0; s < n; ++s) p[s] = std::exp(p[s] - mx) / sum;
                double* orow = &r.out[(qh + t) * D];
                for (int s = 0; s < n; ++s) {
                    for (int e = 0; e < D; ++e) orow[e] += p[s] * v[(kh + s) * D + e];
                }
                double dsum = 0;
                for (int e = 0; e < D; ++e) dsum += gr[e] * orow[e];
                for (int s = 0; s < n; ++s) {
                    double acc = 0;
                    for (int e = 0; e < D; ++e) acc += gr[e] * v[(kh + s) * D + e];
                    const double ds = p[s] * (acc - dsum);
                    for (int e = 0; e < D; ++e) {
                        r.dq[(qh + t) * D + e] += scale * ds * k[(kh + s) * D + e];
                        r.dk[(kh + s) * D + e] += scale * ds * qr[e];
                        r.dv[(kh + s) * D + e] += p[s] * gr[e];
                    }
                }
            }
        }
    }
    return r;
}

// max |dev - ref| / max(max |ref|, floor); both -inf counts as equal, any other non-finite mismatch as infinite.
template <typename T>
double RelErr(const std::vector<T>& dev, const std::vector<double>& ref, double floor = 1e-12) {
    double mref = 0, merr = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = ToD(dev[i]), r = ref[i];
        if (std::isinf(r) && d == r) continue;
        if (!std::isfinite(d) || !std::isfinite(r)) return INFINITY;
        mref = std::max(mref, std::fabs(r));
        merr = std::max(merr, std::fabs(d - r));
    }
    return merr / std::max(mref, floor);
}

template <typename T, FlashPolicy P>
bool RunCase(const Case& c) {
    const size_t nq = size_t(c.B) * c.Hq * c.T * c.D, nk = size_t(c.B) * c.Hkv * c.S * c.D;
    const size_t nl = size_t(c.B) * c.Hq * c.T;
    const double scale = 1.0 / std::sqrt(double(c.D));
    std::vector<double> eq, ek, ev, eg;
    g_seed = 12345 + c.T * 7 + c.S * 131 + c.D + c.Hq * 17 + c.causal;
    auto hq = Random<T>(nq, c.qmul, eq), hk = Random<T>(nk, 1.f, ek), hv = Random<T>(nk, 1.f, ev);
    auto hg = Random<T>(nq, 1.f, eg);
    DevBuf<T> q(nq), k(nk), v(nk), out(nq), dO(nq), dq(nq), dk(nk), dv(nk);
    DevBuf<float> lse(nl), dsum(nl);
    q.Put(hq), k.Put(hk), v.Put(hv), dO.Put(hg);
    // Poison outputs: every element must be written.
    CHECK_CUDA(cudaMemset(out.p, 0xff, nq * sizeof(T) + 1));
    CHECK_CUDA(cudaMemset(dq.p, 0xff, nq * sizeof(T) + 1));
    CHECK_CUDA(cudaMemset(dk.p, 0xff, nk * sizeof(T) + 1));
    CHECK_CUDA(cudaMemset(dv.p, 0xff, nk * sizeof(T) + 1));
    CHECK_CUDA(cudaMemset(lse.p, 0xff, nl * sizeof(float) + 1));
    bool launched = true;
    try {
        launched &=
            LaunchFlashForward<T, P>(q.p, k.p, v.p, out.p, lse.p, c.B, c.Hq, c.Hkv, c.T, c.S, c.D, c.causal, scale, 0);
        launched &= LaunchFlashBackward<T, P>(dO.p, q.p, k.p, v.p, out.p, lse.p, dq.p, dk.p, dv.p, dsum.p, c.B, c.Hq,
                                              c.Hkv, c.T, c.S, c.D, c.causal, scale, 0);
    } catch (const std::exception& e) {
        std::printf("  launch error: %s\n", e.what());
        launched = false;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    const Ref r = Reference(c, scale, eq, ek, ev, eg);
    const double tol = std::is_same<T, float>::value ? 1e-4 : 2e-2;
    const double e_out = RelErr(out.Get(), r.out), e_lse = RelErr(lse.Get(), r.lse, 1.0);
    // dq and dk cancel to ~0 where a row has one key (P = 1, dS = dP - D): relative to max(max |ref|, 1) there.
    const double e_dq = RelErr(dq.Get(), r.dq, 1.0), e_dk = RelErr(dk.Get(), r.dk, 1.0), e_dv = RelErr(dv.Get(), r.dv);
    const bool pass = launched && e_out <= tol && e_lse <= tol && e_dq <= tol && e_dk <= tol && e_dv <= tol;
    std::printf(
        "%-4s %-7s causal=%d B=%d Hq=%d Hkv=%d T=%d S=%d D=%-3d | out %.2e lse %.2e dq %.2e dk %.2e dv %.2e %s%s\n",
        Name<T>(), PolicyName(P), c.causal, c.B, c.Hq, c.Hkv, c.T, c.S, c.D, e_out, e_lse, e_dq, e_dk, e_dv,
        pass ? "PASS" : "FAIL", launched ? "" : " (launcher returned false)");
    return pass;
}

template <typename T>
bool RunAllPolicies(const Case& c) {
    bool ok = RunCase<T, FlashPolicy::kSimt>(c);
    if constexpr (!std::is_same<T, float>::value) {
        ok &= RunCase<T, FlashPolicy::kTileMma>(c);
        ok &= RunCase<T, FlashPolicy::kTileMmaStaged>(c);
    }
    return ok;
}

template <typename T, FlashPolicy P>
void Time(const char* label, int B, int Hq, int Hkv, int T_len, int D) {
    const size_t nq = size_t(B) * Hq * T_len * D, nk = size_t(B) * Hkv * T_len * D, nl = size_t(B) * Hq * T_len;
    std::vector<double> dummy;
    g_seed = 777;
    auto hq = Random<T>(nq, 1.f, dummy), hk = Random<T>(nk, 1.f, dummy), hv = Random<T>(nk, 1.f, dummy);
    DevBuf<T> q(nq), k(nk), v(nk), out(nq), dO(nq), dq(nq), dk(nk), dv(nk);
    DevBuf<float> lse(nl), dsum(nl);
    q.Put(hq), k.Put(hk), v.Put(hv), dO.Put(hq);
    const double scale = 1.0 / std::sqrt(double(D));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    auto median = [&](auto&& f) {
        for (int i = 0; i < 3; ++i) f();
        std::vector<float> ms;
        for (int i = 0; i < 20; ++i) {
            CHECK_CUDA(cudaEventRecord(e0));
            f();
            CHECK_CUDA(cudaEventRecord(e1));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float t = 0;
            CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        return 0.5 * (ms[9] + ms[10]);
    };
    bool ok = true;
    const double fwd = median([&] {
        ok &= LaunchFlashForward<T, P>(q.p, k.p, v.p, out.p, lse.p, B, Hq, Hkv, T_len, T_len, D, true, scale, 0);
    });
    const double bwd = median([&] {
        ok &= LaunchFlashBackward<T, P>(dO.p, q.p, k.p, v.p, out.p, lse.p, dq.p, dk.p, dv.p, dsum.p, B, Hq, Hkv, T_len,
                                        T_len, D, true, scale, 0);
    });
    CHECK_CUDA(cudaDeviceSynchronize());
    const double flops = 4.0 * B * Hq * double(T_len) * T_len * D / 2;  // causal forward
    std::printf("perf %-32s %-4s %-7s fwd %8.3f ms %6.1f TFLOP/s | bwd %8.3f ms %6.1f TFLOP/s | fwd+bwd %8.3f ms%s\n",
                label, Name<T>(), PolicyName(P), fwd, flops / fwd * 1e-9, bwd, 2.5 * flops / bwd * 1e-9, fwd + bwd,
                ok ? "" : " (launcher returned false)");
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

}  // namespace

int main(int argc, char** argv) {
    bool cases = true, perf = true;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--no-perf")) perf = false;
        if (!std::strcmp(argv[i], "--perf-only")) cases = false;
    }
    bool ok = true;
    if (cases) {
        std::vector<Case> list;
        for (int causal = 0; causal < 2; ++causal) {
            list.push_back({bool(causal), 2, 4, 4, 128, 128, 64, 1.f});
            list.push_back({bool(causal), 1, 4, 2, 77, 77, 64, 2.f});
            list.push_back({bool(causal), 1, 6, 1, 100, 100, 32, 1.f});
            list.push_back({bool(causal), 1, 2, 2, 200, 200, 128, 1.f});
            list.push_back({bool(causal), 1, 4, 2, 65, 65, 128, 3.f});
            list.push_back({bool(causal), 2, 2, 1, 33, 33, 32, 1.f});
            list.push_back({bool(causal), 1, 1, 1, 1, 1, 64, 1.f});
            list.push_back({bool(causal), 1, 2, 1, 300, 300, 64, 4.f});
        }
        list.push_back({false, 2, 3, 3, 5, 131, 64, 1.f});
        list.push_back({false, 1, 4, 2, 70, 19, 128, 1.f});
        list.push_back({false, 1, 2, 2, 33, 70, 32, 2.f});
        list.push_back({false, 1, 6, 2, 129, 64, 64, 1.f});
        list.push_back({false, 1, 2, 2, 3, 0, 64, 1.f});  // no keys: out 0, lse -inf, dq 0
        list.push_back({false, 1, 2, 2, 0, 7, 64, 1.f});  // no queries: dk, dv 0
        for (const Case& c : list) {
            ok &= RunAllPolicies<float>(c);
            ok &= RunAllPolicies<bf16_t>(c);
            ok &= RunAllPolicies<fp16_t>(c);
        }
        std::printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
    }
    if (perf) {
        Time<bf16_t, FlashPolicy::kTileMma>("gpt2 B16 H12 T1024 D64", 16, 12, 12, 1024, 64);
        Time<bf16_t, FlashPolicy::kTileMma>("llama B16 Hq12 Hkv4 T1024 D64", 16, 12, 4, 1024, 64);
        Time<bf16_t, FlashPolicy::kTileMma>("B16 H12 T1024 D128", 16, 12, 12, 1024, 128);
        Time<bf16_t, FlashPolicy::kSimt>("gpt2 B16 H12 T1024 D64", 16, 12, 12, 1024, 64);
        Time<float, FlashPolicy::kSimt>("gpt2 B16 H12 T1024 D64", 16, 12, 12, 1024, 64);
    }
    return ok ? 0 : 1;
}
