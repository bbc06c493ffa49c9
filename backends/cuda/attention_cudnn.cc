// sdpa and sdpa_backward through cuDNN's fused attention (cudnn-frontend's
// graph API), for bfloat16 and float16 q, k, v [B, H, T, D] (grouped-query
// k, v [B, Hkv, S, D]), causal or not, fp32 softmax statistics; sdpa_bthd
// and its backward the same on [B, T, H, D] tensors, through strides. One graph
// with its execution plan is built per shape and kept for the process. Cases
// cuDNN declines (float32, float64, head dims it does not support) and
// INFINITRAIN_CUDA_ATTENTION=portable run the provider-neutral kernels.
//
// cuDNN's statistics are the natural-log log-sum-exp of each row of scaled
// scores, which is the op's lse; its probabilities are rounded to bf16/fp16
// before P @ V, so results err by about 2^-8 of |V| against float64.
#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/vendor_cuda.h"
#include "backends/gpu/attention.h"
#include "infinitrain/provider.h"
#include "infinitrain/runtime.h"

namespace infinitrain::gpu {
namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

bool PortableOnly() {
    static const bool on = EnvSwitch("INFINITRAIN_CUDA_ATTENTION", "cudnn", "portable");
    return on;
}

struct Key {
    bool backward, bthd;
    DataType dtype;
    int device;
    int64_t b, h, hk, t, s, d;
    bool causal;
    float scale;
    auto tie() const { return std::tie(backward, bthd, dtype, device, b, h, hk, t, s, d, causal, scale); }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
    std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN declined the case
    int64_t workspace = 0;
};

// Strides of a [B, H, T, D] graph tensor stored as [B, H, T, D] or (bthd) as [B, T, H, D]; statistics [B, H, T, 1]
// are always contiguous.
std::vector<int64_t> Strides(const std::vector<int64_t>& dims, bool bthd) {
    std::vector<int64_t> st(dims.size(), 1);
    for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * dims[i + 1];
    if (bthd) {
        const int64_t h = dims[1], t = dims[2], d = dims[3];
        st = {t * h * d, d, h * d, 1};
    }
    return st;
}

std::shared_ptr<fe::graph::Tensor_attributes> Input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    std::vector<int64_t> dims, bool bthd) {
    return g.tensor(
        fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(Strides(dims, bthd)));
}

void Output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, std::vector<int64_t> dims, bool bthd) {
    t->set_output(true).set_uid(uid).set_dim(dims).set_stride(Strides(dims, bthd));
}

cudnnHandle_t Handle(const Stream& stream) {
    thread_local std::map<int, cudnnHandle_t> handles;  // per device; kept for the thread's life
    cudnnHandle_t& h = handles[stream.device().index];
    if (!h && cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) {
        h = nullptr;
        throw std::runtime_error("cuda: cudnnCreate failed");
    }
    if (cudnnSetStream(h, static_cast<cudaStream_t>(stream.handle())) != CUDNN_STATUS_SUCCESS) {
        throw std::runtime_error("cuda: cudnnSetStream failed");
    }
    return h;
}

// Builds the graph for `k`; returns a null graph when cuDNN cannot run it.
Plan Build(const Key& k, cudnnHandle_t handle) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(k.dtype == DataType::kBFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const bool l = k.bthd;
    auto q = Input(*g, "q", kQ, {k.b, k.h, k.t, k.d}, l);
    auto kk = Input(*g, "k", kK, {k.b, k.hk, k.s, k.d}, l);
    auto v = Input(*g, "v", kV, {k.b, k.hk, k.s, k.d}, l);
    if (!k.backward) {
        auto attrs = fe::graph::SDPA_attributes()
                         .set_name("sdpa")
                         .set_generate_stats(true)
                         .set_attn_scale(k.scale)
                         .set_causal_mask(k.causal);
        auto [o, stats] = g->sdpa(q, kk, v, attrs);
        Output(o, kO, {k.b, k.h, k.t, k.d}, l);
        Output(stats, kStats, {k.b, k.h, k.t, 1}, false);
        stats->set_data_type(fe::DataType_t::FLOAT);
    } else {
        auto o = Input(*g, "o", kO, {k.b, k.h, k.t, k.d}, l);
        auto dout = Input(*g, "do", kDO, {k.b, k.h, k.t, k.d}, l);
        auto stats = Input(*g, "stats", kStats, {k.b, k.h, k.t, 1}, false);
        stats->set_data_type(fe::DataType_t::FLOAT);
        auto attrs = fe::graph::SDPA_backward_attributes()
                         .set_name("sdpa_backward")
                         .set_attn_scale(k.scale)
                         .set_causal_mask(k.causal);
        auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, attrs);
        Output(dq, kDQ, {k.b, k.h, k.t, k.d}, l);
        Output(dk, kDK, {k.b, k.hk, k.s, k.d}, l);
        Output(dv, kDV, {k.b, k.hk, k.s, k.d}, l);
    }
    Plan plan;
    if (!g->validate().is_good() || !g->build_operation_graph(handle).is_good() ||
        !g->create_execution_plans({fe::HeurMode_t::A}).is_good() || !g->check_support(handle).is_good() ||
        !g->build_plans(handle).is_good() || !g->get_workspace_size(plan.workspace).is_good()) {
        return plan;
    }
    plan.graph = g;
    return plan;
}

// The plan for `k` (built on first use); a null graph when cuDNN declines the case.
const Plan& GetPlan(const Key& k, cudnnHandle_t handle) {
    static std::mutex mu;
    static auto* plans = new std::map<Key, Plan>();  // leaked: plans outlive every thread that uses them
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans->find(k);
    if (it == plans->end()) it = plans->emplace(k, Build(k, handle)).first;
    return it->second;
}

void Run(const Plan& plan, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack, const Device& device,
         const char* op) {
    Tensor workspace = Tensor::Empty({std::max<int64_t>(plan.workspace, 1)}, DataType::kUInt8, device);
    auto status = plan.graph->execute(handle, pack, workspace.data());
    if (!status.is_good())
        throw std::runtime_error(std::string(op) + ": cuDNN attention failed: " + status.get_message());
}

bool Eligible(DataType t, int64_t d) {
    return !PortableOnly() && (t == DataType::kBFloat16 || t == DataType::kFloat16) && d % 8 == 0 && d <= 256;
}

// The cache key of q [B, Hq, T, D] and k [B, Hkv, S, D] (bthd: q [B, T, Hq, D], k [B, S, Hkv, D]).
Key MakeKey(const KernelContext& ctx, bool backward, bool bthd, const Tensor& q, const Tensor& k) {
    const Shape &qs = q.shape(), &ks = k.shape();
    const int h = bthd ? 2 : 1, t = bthd ? 1 : 2;
    return Key{backward, bthd,  q.dtype(),     ctx.device.index,
               qs[0],    qs[h], ks[h],         qs[t],
               ks[t],    qs[3], ctx.i(0) != 0, static_cast<float>(ctx.f(1))};
}

void Forward(KernelContext& ctx, bool bthd) {
    const Tensor &q = ctx.in[0], &k = ctx.in[1], &v = ctx.in[2];
    Tensor &out = ctx.out[0], &lse = ctx.out[1];
    auto portable = bthd ? PortableSdpaBthd : PortableSdpa;
    if (!Eligible(q.dtype(), q.size(3)) || q.numel() == 0 || k.numel() == 0) return portable(ctx);
    cudnnHandle_t handle = Handle(ctx.stream);
    const Plan& plan = GetPlan(MakeKey(ctx, false, bthd, q, k), handle);
    if (!plan.graph) return portable(ctx);
    std::unordered_map<int64_t, void*> pack = {
        {kQ, q.data()}, {kK, k.data()}, {kV, v.data()}, {kO, out.data()}, {kStats, lse.data()}};
    Run(plan, handle, pack, ctx.device, bthd ? "sdpa_bthd" : "sdpa");
}

void Backward(KernelContext& ctx, bool bthd) {
    const Tensor &grad = ctx.in[0], &q = ctx.in[1], &k = ctx.in[2], &v = ctx.in[3], &out = ctx.in[4], &lse = ctx.in[5];
    auto portable = bthd ? PortableSdpaBthdBackward : PortableSdpaBackward;
    if (!Eligible(q.dtype(), q.size(3)) || q.numel() == 0 || k.numel() == 0) return portable(ctx);
    cudnnHandle_t handle = Handle(ctx.stream);
    const Plan& plan = GetPlan(MakeKey(ctx, true, bthd, q, k), handle);
    if (!plan.graph) return portable(ctx);
    std::unordered_map<int64_t, void*> pack = {
        {kQ, q.data()},           {kK, k.data()},           {kV, v.data()},
        {kO, out.data()},         {kDO, grad.data()},       {kStats, lse.data()},
        {kDQ, ctx.out[0].data()}, {kDK, ctx.out[1].data()}, {kDV, ctx.out[2].data()}};
    Run(plan, handle, pack, ctx.device, bthd ? "sdpa_bthd_backward" : "sdpa_backward");
}

void Sdpa(KernelContext& ctx) { Forward(ctx, false); }
void SdpaBackward(KernelContext& ctx) { Backward(ctx, false); }
void SdpaBthd(KernelContext& ctx) { Forward(ctx, true); }
void SdpaBthdBackward(KernelContext& ctx) { Backward(ctx, true); }

}  // namespace

REGISTER_PROVIDER_KERNEL_OVERRIDE(kProviderName, "sdpa", Sdpa);
REGISTER_PROVIDER_KERNEL_OVERRIDE(kProviderName, "sdpa_backward", SdpaBackward);
REGISTER_PROVIDER_KERNEL_OVERRIDE(kProviderName, "sdpa_bthd", SdpaBthd);
REGISTER_PROVIDER_KERNEL_OVERRIDE(kProviderName, "sdpa_bthd_backward", SdpaBthdBackward);

}  // namespace infinitrain::gpu
