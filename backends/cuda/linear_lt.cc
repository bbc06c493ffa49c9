// linear through cuBLASLt: out[R, O] = x[R, I] @ w[O, I]^T + bias[O], the bias added in the GEMM's epilogue
// (CUBLASLT_EPILOGUE_BIAS, in float32 before the one rounding into out) where the portable kernel writes the bias
// rows into out and reads them back in a beta = 1 GEMM: two passes over out saved per call.
//
// Layout: row-major x, w and out are column-major x^T [I, R], w^T [I, O] and out^T [O, R], so the column-major
// product is out^T = (w^T)^T @ x^T with A = w (transposed), B = x, and the bias runs along out^T's rows.
// Precision: bfloat16, float16 and float32 operands accumulate in float32 (TF32 only under INFINITRAIN_CUDA_TF32=1),
// split-K partial sums in float32 (no in-place or output-type reductions). float64 and the shapes cuBLASLt
// declines run the portable kernel.
//
// INFINITRAIN_CUDA_LINEAR=lt selects this path; the default, portable, keeps the cuBLAS path until this one has
// been checked on a GPU. Per thread and device: one cuBLASLt handle; per shape, dtype and operand alignment: the
// layouts and the heuristic's algorithm, kept for the thread's life. The workspace comes from the caching
// allocator on the op's stream.
#include "backends/cuda/linear_lt.h"

#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>

#include "backends/cuda/vendor_cuda.h"
#include "backends/gpu/gemm.h"
#include "infinitrain/provider.h"
#include "infinitrain/runtime.h"

namespace infinitrain::gpu {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

bool LtEnabled() {
    static const bool on = EnvSwitch("INFINITRAIN_CUDA_LINEAR", "portable", "lt");
    return on;
}

cublasLtHandle_t LtHandle(int device) {
    thread_local std::map<int, cublasLtHandle_t> handles;  // kept for the thread's life
    cublasLtHandle_t& h = handles[device];
    if (!h) CheckBlas(cublasLtCreate(&h), "cublasLtCreate");
    return h;
}

// The largest power of two up to 256 that divides the address: cuBLASLt's kernels need aligned operands.
uint32_t Alignment(const void* p) {
    auto a = reinterpret_cast<uintptr_t>(p);
    uintptr_t low = a & (~a + 1);
    return a == 0 || low > 256 ? 256 : static_cast<uint32_t>(low);
}

struct Key {
    int device;
    DataType dtype;
    int64_t rows, in_f, out_f;
    bool bias;
    uint32_t align_x, align_w, align_out, align_bias;
    auto tie() const {
        return std::tie(device, dtype, rows, in_f, out_f, bias, align_x, align_w, align_out, align_bias);
    }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
};

std::atomic<uint64_t> lt_calls{0};

struct DescFree {
    void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutFree {
    void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PrefFree {
    void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using Desc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, DescFree>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutFree>;
using Pref = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PrefFree>;

// One descriptor set per key. The bias pointer is set on the descriptor before each call.
struct Plan {
    bool ok = false;  // false: cuBLASLt has no algorithm for the case
    Desc desc;
    Layout a, b, c;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;
};

Layout MakeLayout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t l = nullptr;
    CheckBlas(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
    return Layout(l);
}

cudaDataType_t CudaType(DataType t) {
    return t == DataType::kBFloat16 ? CUDA_R_16BF : (t == DataType::kFloat16 ? CUDA_R_16F : CUDA_R_32F);
}

Plan Build(const Key& k, cublasLtHandle_t h, const void* bias) {
    Plan p;
    const cudaDataType_t t = CudaType(k.dtype);
    const cublasComputeType_t compute =
        k.dtype == DataType::kFloat32 && Tf32Enabled() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t d = nullptr;
    CheckBlas(cublasLtMatmulDescCreate(&d, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    p.desc.reset(d);
    const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA");
    CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB");
    if (k.bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        const int32_t bias_type = t;
        CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "EPILOGUE");
        CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
                  "BIAS_DATA_TYPE");
        CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                  "BIAS_POINTER");
    }
    p.a = MakeLayout(t, k.in_f, k.out_f, k.in_f);
    p.b = MakeLayout(t, k.in_f, k.rows, k.in_f);
    p.c = MakeLayout(t, k.out_f, k.rows, k.out_f);

    cublasLtMatmulPreference_t pr = nullptr;
    CheckBlas(cublasLtMatmulPreferenceCreate(&pr), "cublasLtMatmulPreferenceCreate");
    Pref pref(pr);
    // Split-K only with float32 partial sums: no in-place or output-type reductions.
    const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        uint32_t value;
    } prefs[] = {{CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reductions},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_w},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_x},
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
    // No algorithm for the case: the portable kernel runs it. Any other failure is an error in this file.
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) return p;
    CheckBlas(st, "cublasLtMatmulAlgoGetHeuristic");
    p.ok = true;
    p.algo = result.algo;
    p.workspace = result.workspaceSize;
    return p;
}

void LinearLt(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &w = ctx.in[1], &out = ctx.out[0];
    const Tensor* bias = ctx.in.size() == 3 ? &ctx.in[2] : nullptr;
    const DataType dt = x.dtype();
    const int64_t in_f = w.size(1), out_f = w.size(0), rows = in_f ? x.numel() / in_f : 0;
    if (!LtEnabled() || dt == DataType::kFloat64 || out.numel() == 0 || in_f == 0 || rows > INT32_MAX ||
        in_f > INT32_MAX || out_f > INT32_MAX) {
        return PortableLinear(ctx);
    }
    const void* bp = bias ? bias->data() : nullptr;
    const Key key{ctx.device.index,
                  dt,
                  rows,
                  in_f,
                  out_f,
                  bias != nullptr,
                  Alignment(x.data()),
                  Alignment(w.data()),
                  Alignment(out.data()),
                  bias ? Alignment(bp) : 256u};
    cublasLtHandle_t h = LtHandle(ctx.device.index);
    thread_local std::map<Key, Plan> plans;
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, Build(key, h, bp)).first;
    const Plan& p = it->second;
    if (!p.ok) return PortableLinear(ctx);
    if (bias) {
        CheckBlas(cublasLtMatmulDescSetAttribute(p.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp),
                  "BIAS_POINTER");
    }
    Tensor workspace;
    if (p.workspace) workspace = Tensor::Empty({static_cast<int64_t>(p.workspace)}, DataType::kUInt8, ctx.device);
    const float alpha = 1.0f, beta = 0.0f;
    CheckBlas(cublasLtMatmul(h, p.desc.get(), &alpha, w.data(), p.a.get(), x.data(), p.b.get(), &beta, out.data(),
                             p.c.get(), out.data(), p.c.get(), &p.algo, p.workspace ? workspace.data() : nullptr,
                             p.workspace, static_cast<cudaStream_t>(ctx.stream.handle())),
              "cublasLtMatmul");
    lt_calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

uint64_t LtLinearCalls() { return lt_calls.load(std::memory_order_relaxed); }

REGISTER_PROVIDER_KERNEL_OVERRIDE(kProviderName, "linear", LinearLt);

}  // namespace infinitrain::gpu
