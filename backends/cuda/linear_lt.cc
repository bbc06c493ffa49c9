// linear and its parameter gradients through cuBLASLt, the bias work in the GEMM's epilogue:
//   linear: out[R, O] = x[R, I] @ w[O, I]^T + bias[O], the bias added in float32 before the one rounding into out
//     (CUBLASLT_EPILOGUE_BIAS), where the portable kernel writes the bias rows into out and reads them back in a
//     beta = 1 GEMM.
//   linear_weight_grad: dweight[O, I] = grad[R, O]^T @ x[R, I] and dbias[O] = grad's column sums, the sums in the
//     epilogue (CUBLASLT_EPILOGUE_BGRADB) where the portable kernel reads grad again in a reduction.
//
// Layout: row-major x, w, grad and out are the column-major transposes x^T [I, R], w^T [I, O], grad^T [O, R] and
// out^T [O, R]: out^T = (w^T)^T @ x^T (A = w transposed, B = x) with the bias along out^T's rows; dweight^T [I, O]
// = x^T @ (grad^T)^T (A = x, B = grad transposed) with the bias gradient over B's k = R dimension.
// Precision: bfloat16, float16 and float32 operands accumulate in float32 (TF32 only under INFINITRAIN_CUDA_TF32=1),
// split-K partial sums in float32 (no in-place or output-type reductions), and no split-K where an epilogue meets a
// 16-bit output, so the result is rounded once. float64, empty shapes and the cases cuBLASLt declines run the
// portable kernels.
//
// Not used, from the H200 (2026-12-02, GPT-2's MLP shapes in bfloat16): CUBLASLT_EPILOGUE_GELU_AUX_BIAS (151 us
// against 220 us for linear then gelu_tanh) wrote pre at a coarser rounding than once (a pre of 0.0011 came back 0.0;
// float16's at about bfloat16's precision), and CUBLASLT_EPILOGUE_DGELU (155 us against 240 us for matmul then
// gelu_tanh_backward) missed the GEMM suite's tolerance where gelu_tanh' is near 0; DGELU_BGRAD took 443 us. So
// linear_gelu_tanh and linear_dgelu_tanh run the portable kernels.
//
// The default since it was checked on the H200 (2026-12-02); INFINITRAIN_CUDA_LINEAR=portable runs the portable
// kernels instead. Per thread and device: one cuBLASLt handle; per product, shape, dtype and operand alignment: the
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

#include "backends/cuda/lt.h"
#include "backends/cuda/vendor_cuda.h"
#include "backends/gpu/gemm.h"
#include "infinitrain/provider.h"
#include "infinitrain/runtime.h"

namespace infinitrain::gpu {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

bool LtEnabled() {
    static const bool portable = EnvSwitch("INFINITRAIN_CUDA_LINEAR", "lt", "portable");
    return !portable;
}

// wgrad: linear_weight_grad's product (A = x, B = grad) rather than linear's (A = w, B = x).
struct Key {
    int device;
    DataType dtype;
    int64_t rows, in_f, out_f;
    bool bias, wgrad, tf32;
    uint32_t align_a, align_b, align_out, align_bias;
    auto tie() const {
        return std::tie(device, dtype, rows, in_f, out_f, bias, wgrad, tf32, align_a, align_b, align_out, align_bias);
    }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
};

std::atomic<uint64_t> lt_calls[2] = {{0}, {0}};  // linear, linear_weight_grad

using lt::Alignment;
using lt::Desc;
using lt::Layout;
using lt::MakeLayout;
using lt::Pref;

// One descriptor set per key. The bias pointer is set on the descriptor before each call.
struct Plan {
    bool ok = false;  // false: cuBLASLt has no algorithm for the case
    Desc desc;
    Layout a, b, c;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;
};

cudaDataType_t CudaType(DataType t) {
    return t == DataType::kBFloat16 ? CUDA_R_16BF : (t == DataType::kFloat16 ? CUDA_R_16F : CUDA_R_32F);
}

Plan Build(const Key& k, cublasLtHandle_t h, const void* bias) {
    Plan p;
    const cudaDataType_t t = CudaType(k.dtype);
    const cublasComputeType_t compute = k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t d = nullptr;
    CheckBlas(cublasLtMatmulDescCreate(&d, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    p.desc.reset(d);
    const cublasOperation_t opa = k.wgrad ? CUBLAS_OP_N : CUBLAS_OP_T, opb = k.wgrad ? CUBLAS_OP_T : CUBLAS_OP_N;
    CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA");
    CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB");
    if (k.bias) {
        const cublasLtEpilogue_t epi = k.wgrad ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BIAS;
        const int32_t bias_type = t;
        CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "EPILOGUE");
        CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
                  "BIAS_DATA_TYPE");
        CheckBlas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                  "BIAS_POINTER");
    }
    if (k.wgrad) {  // dweight^T [I, O] = x^T [I, R] @ (grad^T [O, R])^T
        p.a = MakeLayout(t, k.in_f, k.rows, k.in_f);
        p.b = MakeLayout(t, k.out_f, k.rows, k.out_f);
        p.c = MakeLayout(t, k.in_f, k.out_f, k.in_f);
    } else {  // out^T [O, R] = (w^T [I, O])^T @ x^T [I, R]
        p.a = MakeLayout(t, k.in_f, k.out_f, k.in_f);
        p.b = MakeLayout(t, k.in_f, k.rows, k.in_f);
        p.c = MakeLayout(t, k.out_f, k.rows, k.out_f);
    }

    cublasLtMatmulPreference_t pr = nullptr;
    CheckBlas(cublasLtMatmulPreferenceCreate(&pr), "cublasLtMatmulPreferenceCreate");
    Pref pref(pr);
    // Split-K only with float32 partial sums: no in-place or output-type reductions. None at all with an epilogue
    // and a 16-bit output: measured on the H200, split-K plans then add the bias after rounding the product to
    // bfloat16 (a second rounding, up to half an ulp of x @ w^T rather than of the result). The bias-gradient
    // epilogue follows the same rule untested: its split partial sums could round alike.
    const bool no_split = k.bias && k.dtype != DataType::kFloat32;
    const uint32_t reductions = no_split ? CUBLASLT_REDUCTION_SCHEME_NONE : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        uint32_t value;
    } prefs[] = {{CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reductions},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_a},
                 {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_b},
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

// Runs the product of `key` (a, b, out and bias as Build's layouts name them); false when cuBLASLt has no
// algorithm for it, so the caller runs the portable kernel.
bool RunLt(const KernelContext& ctx, const Key& key, const void* a, const void* b, void* out, const void* bias) {
    cublasLtHandle_t h = lt::Handle(ctx.device.index);
    thread_local std::map<Key, Plan> plans;
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, Build(key, h, bias)).first;
    const Plan& p = it->second;
    if (!p.ok) return false;
    if (bias) {
        CheckBlas(cublasLtMatmulDescSetAttribute(p.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                  "BIAS_POINTER");
    }
    Tensor workspace;
    if (p.workspace) workspace = Tensor::Empty({static_cast<int64_t>(p.workspace)}, DataType::kUInt8, ctx.device);
    const float alpha = 1.0f, beta = 0.0f;
    CheckBlas(cublasLtMatmul(h, p.desc.get(), &alpha, a, p.a.get(), b, p.b.get(), &beta, out, p.c.get(), out, p.c.get(),
                             &p.algo, p.workspace ? workspace.data() : nullptr, p.workspace,
                             static_cast<cudaStream_t>(ctx.stream.handle())),
              "cublasLtMatmul");
    lt_calls[key.wgrad].fetch_add(1, std::memory_order_relaxed);
    return true;
}

// Shapes cuBLASLt takes: 16- and 32-bit floats, nothing empty, every dimension an int.
bool LtShape(DataType dt, int64_t rows, int64_t in_f, int64_t out_f) {
    return LtEnabled() && dt != DataType::kFloat64 && rows > 0 && in_f > 0 && out_f > 0 && rows <= INT32_MAX &&
           in_f <= INT32_MAX && out_f <= INT32_MAX;
}

void LinearLt(KernelContext& ctx) {
    const Tensor &x = ctx.in[0], &w = ctx.in[1], &out = ctx.out[0];
    const Tensor* bias = ctx.in.size() == 3 ? &ctx.in[2] : nullptr;
    const int64_t in_f = w.size(1), out_f = w.size(0), rows = in_f ? x.numel() / in_f : 0;
    if (!LtShape(x.dtype(), rows, in_f, out_f)) return PortableLinear(ctx);
    const void* bp = bias ? bias->data() : nullptr;
    const Key key{ctx.device.index,
                  x.dtype(),
                  rows,
                  in_f,
                  out_f,
                  bias != nullptr,
                  false,
                  x.dtype() == DataType::kFloat32 && Tf32Enabled(),
                  Alignment(w.data()),
                  Alignment(x.data()),
                  Alignment(out.data()),
                  bias ? Alignment(bp) : 256u};
    if (!RunLt(ctx, key, w.data(), x.data(), out.data(), bp)) PortableLinear(ctx);
}

// linear_weight_grad with the bias gradient in the epilogue (CUBLASLT_EPILOGUE_BGRADB: grad's sums over the
// product's k = R dimension, taken from the operand tiles the GEMM already loads).
void LinearWeightGradLt(KernelContext& ctx) {
    const Tensor &g = ctx.in[0], &x = ctx.in[1], &dw = ctx.out[0], &db = ctx.out[1];
    const bool bias = ctx.i(0) != 0;
    const int64_t out_f = g.size(-1), in_f = x.size(-1), rows = out_f ? g.numel() / out_f : 0;
    if (!LtShape(g.dtype(), rows, in_f, out_f)) return PortableLinearWeightGrad(ctx);
    void* bp = bias ? db.data() : nullptr;
    const Key key{ctx.device.index,
                  g.dtype(),
                  rows,
                  in_f,
                  out_f,
                  bias,
                  true,
                  g.dtype() == DataType::kFloat32 && Tf32Enabled(),
                  Alignment(x.data()),
                  Alignment(g.data()),
                  Alignment(dw.data()),
                  bias ? Alignment(bp) : 256u};
    if (!RunLt(ctx, key, x.data(), g.data(), dw.data(), bp)) PortableLinearWeightGrad(ctx);
}

}  // namespace

uint64_t LtLinearCalls() { return lt_calls[0].load(std::memory_order_relaxed); }
uint64_t LtWeightGradCalls() { return lt_calls[1].load(std::memory_order_relaxed); }

REGISTER_PROVIDER_KERNEL_OVERRIDE(kProviderName, "linear", LinearLt);
REGISTER_PROVIDER_KERNEL_OVERRIDE(kProviderName, "linear_weight_grad", LinearWeightGradLt);

}  // namespace infinitrain::gpu
