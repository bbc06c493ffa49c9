// A minimal provider for the mechanism's own tests: the host-memory runtime
// (synchronous streams) with a counting BLAS hook, kernels for only a few ops
// (the CPU's, called directly), and two ops of its own, so the tests can see
// a provider with missing ops, the CPU fallback, composites, provider ops and
// two different providers in one process. PROVIDER_NAME comes from the build
// (fake, fake2, fakebad); fakebad also adds a kernel for an op that does not
// exist and an op whose backward names an op that does not exist, so its
// registration must fail and leave nothing registered (INFINITRAIN_FAKEBAD_FAULTS
// picks the faults: the backward one alone the core once found only half-way
// through activation; with none fakebad registers).
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "infinitrain/host_runtime.h"
#include "infinitrain/provider.h"

#define STR2(x) #x
#define STR(x) STR2(x)

namespace {

using namespace infinitrain;

constexpr const char* kName = STR(PROVIDER_NAME);

std::atomic<int64_t> g_handles{0};
std::atomic<int64_t> g_binds{0};
std::atomic<int64_t> g_override_calls{0};

class FakeRuntime final : public HostMemoryRuntime {
public:
    FakeRuntime() : HostMemoryRuntime(DeviceType::kPrivateUse1, 2) {}
    void* CreateBlasHandle(int) override { return new int64_t(++g_handles); }
    void SetBlasStream(void*, const Stream&) override { ++g_binds; }
};

// Device memory is host memory here, so the CPU kernel can run on the same context.
void CpuKernel(KernelContext& ctx) { ctx.op->Kernel(DeviceType::kCPU)(ctx); }

// Replaces the plain fill_ kernel registered below; counts its calls so the tests see which one ran.
void FillOverride(KernelContext& ctx) {
    ++g_override_calls;
    CpuKernel(ctx);
}

// <name>.scale_add(x, y; alpha) = x + alpha * y, float32 or float64.
std::vector<TensorMeta> ScaleAddShape(const char* op, const std::vector<Tensor>& in, const Attrs&) {
    if (in[0].shape() != in[1].shape() || in[0].dtype() != in[1].dtype()) {
        OpError(op, "x and y must have one shape and dtype");
    }
    return {{in[0].shape(), in[0].dtype()}};
}

template <typename T>
void ScaleAdd(KernelContext& ctx) {
    const T *x = ctx.in[0].data<T>(), *y = ctx.in[1].data<T>();
    T* out = ctx.out[0].data<T>();
    T alpha = static_cast<T>(ctx.f(0));
    for (int64_t i = 0; i < ctx.out[0].numel(); ++i) out[i] = x[i] + alpha * y[i];
}

void ScaleAddKernel(KernelContext& ctx) {
    if (ctx.in[0].dtype() == DataType::kFloat64) return ScaleAdd<double>(ctx);
    ScaleAdd<float>(ctx);
}

std::vector<Tensor> ScaleAddComposite(const std::vector<Tensor>& in, const Attrs& attrs) {
    Tensor scaled = GetOp("affine").Call({in[1]}, {attrs[0], AttrValue(0.0)})[0];
    return GetOp("add").Call({in[0], scaled}, {});
}

// <name>.blas_probe(x) -> int64 [4]: the calling thread's BLAS handle id, handles made, stream binds, and
// calls of the fill_ override.
std::vector<TensorMeta> ProbeShape(const char*, const std::vector<Tensor>&, const Attrs&) {
    return {{Shape{4}, DataType::kInt64}};
}

void ProbeKernel(KernelContext& ctx) {
    int64_t* out = ctx.out[0].data<int64_t>();
    out[0] = *static_cast<int64_t*>(BlasHandle(ctx.stream));
    out[1] = g_handles;
    out[2] = g_binds;
    out[3] = g_override_calls;
}

}  // namespace

REGISTER_PROVIDER_RUNTIME(kName, FakeRuntime);
// Enough to create tensors, run elementwise arithmetic and compose silu; nothing else.
REGISTER_PROVIDER_KERNEL(kName, "fill_", CpuKernel);
REGISTER_PROVIDER_KERNEL_OVERRIDE(kName, "fill_", FillOverride);
REGISTER_PROVIDER_KERNEL(kName, "cast", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "add", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "mul", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "sigmoid", CpuKernel);
REGISTER_PROVIDER_OP(kName,
                     (OpDef{STR(PROVIDER_NAME) ".scale_add(x, y; alpha: float) -> out", OpTier::kProvider,
                            DtypeBit(DataType::kFloat32) | DtypeBit(DataType::kFloat64), "", ScaleAddShape,
                            "x + alpha * y (a provider op with a kernel and a composite)"}),
                     ScaleAddKernel, ScaleAddComposite);
REGISTER_PROVIDER_OP(kName,
                     (OpDef{STR(PROVIDER_NAME) ".blas_probe(x) -> out", OpTier::kProvider, kAllDtypes, "", ProbeShape,
                            "the BLAS handle of the calling thread (a test probe)"}),
                     ProbeKernel, nullptr);
#ifdef BROKEN
namespace {
// INFINITRAIN_FAKEBAD_FAULTS (read when the module loads): the faults to add, "kernel" and/or "backward";
// unset: both.
bool Fault(const char* which) {
    const char* env = std::getenv("INFINITRAIN_FAKEBAD_FAULTS");
    return !env || std::strstr(env, which) != nullptr;
}
std::vector<TensorMeta> SameShape(const char*, const std::vector<Tensor>& in, const Attrs&) {
    return {{in[0].shape(), in[0].dtype()}};
}
// A kernel for an op that does not exist.
const bool kKernelFault =
    !Fault("kernel") || (AddProviderKernel(kName, "no_such_op", CpuKernel, INFINITRAIN_SITE), true);
// A well-formed op whose backward names an op that exists nowhere.
const bool kBackwardFault =
    !Fault("backward") || (AddProviderOp(kName,
                                         OpDef{STR(PROVIDER_NAME) ".bad_backward(x) -> out", OpTier::kProvider,
                                               kFloatDtypes, STR(PROVIDER_NAME) ".bad_backward mul no_such_backward_op",
                                               SameShape, "an op whose backward uses an op that does not exist"},
                                         nullptr, nullptr, INFINITRAIN_SITE),
                           true);
}  // namespace
// No fault: an op whose backward uses another op of the provider's, added after it (registration must add the
// later one first).
REGISTER_PROVIDER_OP(kName,
                     (OpDef{STR(PROVIDER_NAME) ".uses_later(x) -> out", OpTier::kProvider, kFloatDtypes,
                            STR(PROVIDER_NAME) ".later mul", SameShape, "an op whose backward uses a later op"}),
                     nullptr, nullptr);
REGISTER_PROVIDER_OP(kName,
                     (OpDef{STR(PROVIDER_NAME) ".later(x) -> out", OpTier::kProvider, kFloatDtypes, "", SameShape,
                            "the op the one before uses in its backward"}),
                     nullptr, nullptr);
#endif

PYBIND11_MODULE(MODULE_NAME, m) {
    m.def("register_backend", [] { RegisterProvider({kName, DataType::kFloat16}); });
}
