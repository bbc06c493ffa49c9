#include "infinitrain/op.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace infinitrain {

// Defined in op_table.cc.
std::vector<OpSchema> BuildOpSchemas();

namespace {

struct Registry {
    std::map<std::string, Op*> by_name;
    std::vector<Op*> ops;  // table order
    std::vector<std::string> errors;
    std::mutex mu;
    Registry() {
        for (OpSchema& s : BuildOpSchemas()) {
            Op* op = new Op(std::move(s));  // lives for the process
            ops.push_back(op);
            by_name[op->name()] = op;
        }
    }
};

Registry& GetRegistry() {
    static Registry* r = new Registry();
    return *r;
}

bool g_poison = false;
bool g_fallback = false;
std::function<void(const std::string&)> g_warn;

// Copies inputs to the host, runs the CPU kernel there and copies outputs (and in-place inputs) back.
void RunOnCpu(const Op& op, const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
    const Device cpu{};
    std::vector<Tensor> hin;
    hin.reserve(in.size());
    for (const Tensor& t : in) hin.push_back(t.To(cpu));
    std::vector<Tensor> hout;
    hout.reserve(out.size());
    for (const Tensor& t : out) hout.push_back(Tensor::Empty(t.shape(), t.dtype(), cpu));
    KernelContext ctx{hin, hout, attrs, cpu, nullptr, &op};
    op.Kernel(DeviceType::kCPU)(ctx);
    for (size_t k = 0; k < out.size(); ++k) hout[k].CopyTo(out[k]);
    for (int k : op.schema().inplace) hin[k].CopyTo(in[k]);
}

}  // namespace

int64_t KernelContext::i(size_t k) const { return std::get<int64_t>(attrs[k]); }
double KernelContext::f(size_t k) const {
    const AttrValue& v = attrs[k];
    if (const int64_t* p = std::get_if<int64_t>(&v)) return static_cast<double>(*p);
    return std::get<double>(v);
}
const std::vector<int64_t>& KernelContext::ints(size_t k) const { return std::get<std::vector<int64_t>>(attrs[k]); }
const std::string& KernelContext::s(size_t k) const { return std::get<std::string>(attrs[k]); }

void RegisterKernel(DeviceType type, const char* op, KernelFn fn, const char* site) {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_name.find(op);
    if (it == r.by_name.end()) {
        r.errors.push_back(std::string("kernel registered at ") + site + " for unknown op '" + op + "'");
        return;
    }
    Op* o = it->second;
    int t = static_cast<int>(type);
    if (o->kernels_[t]) {
        r.errors.push_back(std::string("op '") + op + "' has two kernels for device type " + std::to_string(t) +
                           ": registered at " + o->sites_[t] + " and at " + site);
        return;
    }
    o->kernels_[t] = fn;
    o->sites_[t] = site;
}

void CheckRegistrations() {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.errors.empty()) return;
    std::string msg = "kernel registration failed:";
    for (const std::string& e : r.errors) msg += "\n  " + e;
    throw std::runtime_error(msg);
}

const Op& GetOp(const std::string& name) {
    Registry& r = GetRegistry();
    auto it = r.by_name.find(name);
    if (it == r.by_name.end()) throw std::invalid_argument("unknown op '" + name + "' (see docs/ops.md for the list)");
    return *it->second;
}

std::vector<const Op*> AllOps() {
    Registry& r = GetRegistry();
    return std::vector<const Op*>(r.ops.begin(), r.ops.end());
}

void SetPoisonOutputs(bool on) { g_poison = on; }
void SetCpuFallback(bool on) { g_fallback = on; }
bool CpuFallback() { return g_fallback; }
void SetWarningHandler(std::function<void(const std::string&)> handler) { g_warn = std::move(handler); }
bool PoisonOutputs() { return g_poison; }

std::vector<TensorMeta> Op::Meta(const std::vector<Tensor>& in, const Attrs& attrs) const {
    int n = static_cast<int>(in.size());
    if (n < schema_.min_inputs || (schema_.max_inputs >= 0 && n > schema_.max_inputs)) {
        OpError(schema_.name,
                "expected inputs (" + std::string(schema_.inputs) + "), got " + std::to_string(n) + " tensor(s)");
    }
    for (int k = 0; k < n; ++k) {
        if (!in[k].defined()) OpError(schema_.name, "input " + std::to_string(k) + " is undefined");
    }
    try {
        return schema_.meta(in, attrs);
    } catch (const std::invalid_argument& e) {
        // Shared shape rules leave the op's name out; add it.
        std::string msg = e.what(), prefix = std::string(schema_.name) + ":";
        if (msg.rfind(prefix, 0) == 0) throw;
        throw std::invalid_argument(prefix + " " + msg);
    }
}

std::vector<Tensor> Op::Call(const std::vector<Tensor>& in, const Attrs& attrs) const {
    if (in.empty()) OpError(schema_.name, "needs at least one input tensor");
    std::vector<TensorMeta> metas = Meta(in, attrs);
    const Device device = in[0].device();
    for (size_t k = 1; k < in.size(); ++k) {
        if (in[k].device() != device) {
            OpError(schema_.name, "expected all inputs on one device, got " + device.ToString() + " (input 0) and " +
                                      in[k].device().ToString() + " (input " + std::to_string(k) + ")");
        }
    }
    KernelFn fn = kernels_[static_cast<int>(device.type)];
    bool fallback = false;
    if (!fn) {
        if (!g_fallback || !kernels_[0]) {
            throw MissingKernelError("op '" + std::string(schema_.name) + "' has no kernel for device " +
                                     device.ToString() + " (provider '" + DeviceTypeName(device.type) + "')");
        }
        fallback = true;
        if (!warned_fallback_.exchange(true) && g_warn) {
            g_warn("op '" + std::string(schema_.name) + "' has no " + DeviceTypeName(device.type) +
                   " kernel; running it on the CPU (CPU fallback)");
        }
    }
    std::vector<Tensor> out;
    out.reserve(metas.size());
    for (const TensorMeta& m : metas) out.push_back(Tensor::Empty(m.shape, m.dtype, device));
    if (g_poison) {
        DeviceRuntime& rt = GetRuntime(device.type);
        // On the kernel's stream, so the fill is ordered before the kernel.
        for (Tensor& t : out) {
            if (t.nbytes()) rt.Memset(t.data(), 0xff, t.nbytes(), device.index, CurrentStream(device));
        }
    }
    for (int k : schema_.inplace) in[k].storage()->BumpVersion();
    if (fallback) {
        RunOnCpu(*this, in, out, attrs);
        return out;
    }
    KernelContext ctx{in, out, attrs, device, CurrentStream(device), this};
    fn(ctx);
    return out;
}

// Shared shape rules pass "" and Op::Meta adds the op's name.
void OpError(const char* op, const std::string& what) {
    throw std::invalid_argument(*op ? std::string(op) + ": " + what : what);
}

int64_t NormalizeDim(const char* op, int64_t dim, int64_t ndim) {
    if (dim < -ndim || dim >= ndim) {
        OpError(op, "dim " + std::to_string(dim) + " out of range for a " + std::to_string(ndim) +
                        "-d tensor (expected " + std::to_string(-ndim) + " <= dim < " + std::to_string(ndim) + ")");
    }
    return dim < 0 ? dim + ndim : dim;
}

Shape BroadcastShapes(const char* op, const Shape& a, const Shape& b) {
    size_t n = std::max(a.size(), b.size());
    Shape out(n);
    for (size_t i = 0; i < n; ++i) {
        int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
        int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
        if (da != db && da != 1 && db != 1) {
            OpError(op, "shapes " + ShapeToString(a) + " and " + ShapeToString(b) + " cannot be broadcast together");
        }
        out[i] = da == 1 ? db : da;
    }
    return out;
}

}  // namespace infinitrain
