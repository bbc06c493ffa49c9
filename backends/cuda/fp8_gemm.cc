// fp8_matmul through cuBLASLt's FP8 GEMMs (Hopper and Ada tensor cores):
//   out[M, N] = op(a)[M, K] @ op(b)[K, N] * a_scale_inv * b_scale_inv + bias[N]
// float8 operands (e4m3 x e4m3, or one of them e5m2), float32 accumulation (CUBLAS_COMPUTE_32F, no fast
// accumulation), the scale_invs read on the device (CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER), the bias in the
// epilogue for 16-bit outputs (a float32 output adds it after: FP8 kernels take no float32 bias), out rounded once.
//
// Layout: FP8 tensor cores take both operands K-contiguous ("TN"): row-major a [M, K] and b [N, K] are the
// column-major a^T [K, M] and b^T [K, N], and out^T [N, M] = (b^T)^T @ a^T: A = b transposed, B = a. An operand
// stored the other way (trans_a = 1, or trans_b = 0) is transposed into scratch first (one byte an element).
// Shapes outside cuBLASLt's FP8 rules (dimensions multiples of 16, 16-byte aligned pointers), cases it has no
// algorithm for, and compute capability below 8.9 run the plain kernel (backends/gpu/fp8.h), as does everything
// under INFINITRAIN_CUDA_FP8=portable. Reviewed against cuBLASLt's documentation; not yet run on a GPU.
#include "backends/cuda/fp8_gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <tuple>

#include "backends/cuda/lt.h"
#include "backends/cuda/vendor_cuda.h"
#include "backends/gpu/fp8.h"
#include "infinitrain/provider.h"
#include "infinitrain/runtime.h"

namespace infinitrain::gpu {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
std::atomic<uint64_t> lt_fp8_calls{0};

bool LtEnabled() {
    static const bool portable = EnvSwitch("INFINITRAIN_CUDA_FP8", "lt", "portable");
    return !portable;
}

// FP8 tensor cores: compute capability 8.9 (Ada) and later.
bool HasFp8(int device) {
    thread_local std::map<int, bool> known;
    auto it = known.find(device);
    if (it != known.end()) return it->second;
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    return known[device] = major * 10 + minor >= 89;
}

cudaDataType_t Fp8Type(DataType t) { return t == DataType::kFloat8E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

cudaDataType_t OutType(DataType t) {
    return t == DataType::kBFloat16 ? CUDA_R_16BF : (t == DataType::kFloat16 ? CUDA_R_16F : CUDA_R_32F);
}

struct Key {
    int device;
    DataType a, b, out;
    int64_t m, n, k;
    bool bias;
    uint32_t align_a, align_b, align_out, align_bias;
    auto tie() const { return std::tie(device, a, b, out, m, n, k, bias, align_a, align_b, align_out, align_bias); }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
    bool ok = false;  // false: cuBLASLt has no algorithm for the case
    lt::Desc desc;
    lt::Layout a, b, c;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;
};

void SetPointer(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void* p, const char* what) {
    CheckBlas(cublasLtMatmulDescSetAttribute(d, attr, &p, sizeof p), what);
}

Plan Build(const Key& k, cublasLtHandle_t h, const void* bias) {
    Plan p;
    cublasLtMatmulDesc_t d = nullptr;
    CheckBlas(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    p.desc.reset(d);
    const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA");
    CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB");
    const int8_t fast = 0;
    CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast), "FAST_ACCUM");
    // Placeholders so the heuristic sees a descriptor with scales (and bias) set; RunLt sets the real pointers.
    static const float kOne = 1.0f;
    SetPointer(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &kOne, "A_SCALE_POINTER");
    SetPointer(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &kOne, "B_SCALE_POINTER");
    const cudaDataType_t ot = OutType(k.out);
    if (k.bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        const int32_t bias_type = ot;
        CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "EPILOGUE");
        CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
                  "BIAS_DATA_TYPE");
        SetPointer(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "BIAS_POINTER");  // the heuristic reads its alignment
    }
    // out^T [N, M] = (b^T [K, N])^T @ a^T [K, M]
    p.a = lt::MakeLayout(Fp8Type(k.b), k.k, k.n, k.k);
    p.b = lt::MakeLayout(Fp8Type(k.a), k.k, k.m, k.k);
    p.c = lt::MakeLayout(ot, k.n, k.m, k.n);

    cublasLtMatmulPreference_t pr = nullptr;
    CheckBlas(cublasLtMatmulPreferenceCreate(&pr), "cublasLtMatmulPreferenceCreate");
    lt::Pref pref(pr);
    // Split-K only with float32 partial sums; none where the bias meets a 16-bit output (one rounding).
    const bool no_split = k.bias && k.out != DataType::kFloat32;
    const uint32_t reductions = no_split ? CUBLASLT_REDUCTION_SCHEME_NONE : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        uint32_t value;
    } prefs[] = {{CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reductions},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_out},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_out}};
    for (const auto& e : prefs) {
        CheckBlas(cublasLtMatmulPreferenceSetAttribute(pr, e.attr, &e.value, sizeof e.value),
                  "cublasLtMatmulPreferenceSetAttribute");
    }
    const uint64_t ws = kWorkspaceBytes;
    CheckBlas(cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
              "cublasLtMatmulPreferenceSetAttribute");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(h, d, p.a.get(), p.b.get(), p.c.get(), p.c.get(), pr, 1, &result, &found);
    // No algorithm: the plain kernel runs it. INVALID_VALUE is an error here: the documented FP8 rules were checked
    // before (FitsFp8), so it means a descriptor this file got wrong.
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) return p;
    CheckBlas(st, "cublasLtMatmulAlgoGetHeuristic");
    p.ok = true;
    p.algo = result.algo;
    p.workspace = result.workspaceSize;
    return p;
}

// cuBLASLt's documented FP8 requirements: k, and both operands' and the output's leading dimensions, multiples of
// 16; 16-byte aligned pointers. Cases outside them run the plain kernel without asking cuBLASLt.
bool FitsFp8(int64_t m, int64_t n, int64_t k, const Key& key) {
    const uint32_t align = std::min({key.align_a, key.align_b, key.align_out, key.align_bias});
    return m % 16 == 0 && n % 16 == 0 && k % 16 == 0 && align >= 16;
}

void Fp8MatmulLt(KernelContext& ctx) {
    const Tensor &a = ctx.in[0], &b = ctx.in[1], &out = ctx.out[0];
    const Tensor* bias = ctx.in.size() == 5 ? &ctx.in[4] : nullptr;
    const bool ta = ctx.i(0) != 0, tb = ctx.i(1) != 0;
    const int64_t m = out.size(0), n = out.size(1), k = ta ? a.size(0) : a.size(1);
    if (!LtEnabled() || m == 0 || n == 0 || k == 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX ||
        !HasFp8(ctx.device.index)) {
        return PortableFp8Matmul(ctx);
    }
    // FP8 kernels take no float32 bias (cuBLASLt wants bfloat16 there): a float32 output adds it after the GEMM.
    const bool epilogue_bias = bias && out.dtype() != DataType::kFloat32;
    const void* bp = epilogue_bias ? bias->data() : nullptr;
    // Operands stored the other way are transposed into fresh scratch (allocator blocks are 256-byte aligned).
    const Key key{ctx.device.index,
                  a.dtype(),
                  b.dtype(),
                  out.dtype(),
                  m,
                  n,
                  k,
                  epilogue_bias,
                  ta ? 256u : lt::Alignment(a.data()),
                  tb ? lt::Alignment(b.data()) : 256u,
                  lt::Alignment(out.data()),
                  epilogue_bias ? lt::Alignment(bp) : 256u};
    if (!FitsFp8(m, n, k, key)) return PortableFp8Matmul(ctx);
    cublasLtHandle_t h = lt::Handle(ctx.device.index);
    thread_local std::map<Key, Plan> plans;
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, Build(key, h, bp)).first;
    const Plan& p = it->second;
    if (!p.ok) return PortableFp8Matmul(ctx);
    // K-contiguous operands: a as [M, K], b as [N, K].
    Tensor ak = a, bk = b;
    if (ta) {
        ak = Tensor::Empty({m, k}, a.dtype(), ctx.device);
        TransposeBytes(ctx, a, ak, k, m);
    }
    if (!tb) {
        bk = Tensor::Empty({n, k}, b.dtype(), ctx.device);
        TransposeBytes(ctx, b, bk, k, n);
    }
    cublasLtMatmulDesc_t d = p.desc.get();
    SetPointer(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, ctx.in[3].data(), "A_SCALE_POINTER");  // b's
    SetPointer(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, ctx.in[2].data(), "B_SCALE_POINTER");  // a's
    if (bp) SetPointer(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bp, "BIAS_POINTER");
    Tensor workspace;
    if (p.workspace) workspace = Tensor::Empty({static_cast<int64_t>(p.workspace)}, DataType::kUInt8, ctx.device);
    const float alpha = 1.0f, beta = 0.0f;
    CheckBlas(cublasLtMatmul(h, d, &alpha, bk.data(), p.a.get(), ak.data(), p.b.get(), &beta, out.data(), p.c.get(),
                             out.data(), p.c.get(), &p.algo, p.workspace ? workspace.data() : nullptr, p.workspace,
                             static_cast<cudaStream_t>(ctx.stream.handle())),
              "cublasLtMatmul (fp8)");
    if (bias && !epilogue_bias) AddBiasFloat32(ctx, out, *bias, m, n);
    lt_fp8_calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

uint64_t LtFp8Calls() { return lt_fp8_calls.load(std::memory_order_relaxed); }

REGISTER_PROVIDER_KERNEL(kProviderName, "fp8_matmul", Fp8MatmulLt);

}  // namespace infinitrain::gpu
