#include "infinitrain/op.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "infinitrain/profiler.h"

namespace infinitrain {

// The op table (op_table.cc).
extern const OpDef kOpTable[];
extern const size_t kOpTableSize;

namespace {

std::string Trim(const std::string& s) {
    size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> SplitList(const std::string& s, char sep) {
    std::vector<std::string> parts;
    std::string cur;
    for (char c : s) {
        if (c == sep) {
            parts.push_back(Trim(cur));
            cur.clear();
        } else {
            cur += c;
        }
    }
    if (!Trim(cur).empty() || !parts.empty()) parts.push_back(Trim(cur));
    return parts;
}

bool IsIdentifier(const std::string& s, bool dots) {
    if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
    for (char c : s) {
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (dots && c == '.'))) return false;
    }
    return true;
}

const char* AttrTypeName(AttrType t) {
    switch (t) {
        case AttrType::kInt:
            return "an int";
        case AttrType::kFloat:
            return "a float";
        case AttrType::kInts:
            return "a list of ints";
        case AttrType::kStr:
            return "a string";
    }
    return "?";
}

bool AttrMatches(AttrType t, const AttrValue& v) {
    switch (t) {
        case AttrType::kInt:
            return std::holds_alternative<int64_t>(v);
        case AttrType::kFloat:
            return std::holds_alternative<double>(v) || std::holds_alternative<int64_t>(v);
        case AttrType::kInts:
            return std::holds_alternative<std::vector<int64_t>>(v);
        case AttrType::kStr:
            return std::holds_alternative<std::string>(v);
    }
    return false;
}

}  // namespace

std::string DtypeSetName(DtypeSet s) {
    if (s == kAllDtypes) return "all";
    if (s == (kAllDtypes | kFloat8Dtypes)) return "all float8_e4m3fn float8_e5m2";
    // The float dtypes first, in the order the docs have always listed them.
    static const DataType order[] = {DataType::kFloat32,    DataType::kBFloat16,  DataType::kFloat16,
                                     DataType::kFloat64,    DataType::kInt32,     DataType::kInt64,
                                     DataType::kInt8,       DataType::kUInt8,     DataType::kBool,
                                     DataType::kFloat8E4M3, DataType::kFloat8E5M2};
    std::string out;
    for (DataType t : order) {
        if (s & DtypeBit(t)) out += (out.empty() ? "" : " ") + std::string(DataTypeName(t));
    }
    return out;
}

OpSchema ParseOpSchema(const OpDef& def) {
    std::string text = def.schema;
    auto fail = [&](const std::string& what) -> void {
        throw std::invalid_argument("op schema '" + text + "': " + what);
    };
    size_t open = text.find('('), arrow = text.find("->");
    size_t close = arrow == std::string::npos ? std::string::npos : text.rfind(')', arrow);
    if (open == std::string::npos || close == std::string::npos || close < open) {
        fail("expected 'name(inputs; attrs) -> outputs'");
    }
    OpSchema s;
    s.text = text;
    s.name = Trim(text.substr(0, open));
    if (!IsIdentifier(s.name, true)) fail("bad op name '" + s.name + "'");
    std::string args = text.substr(open + 1, close - open - 1);
    size_t semi = args.find(';');
    std::string ins = semi == std::string::npos ? args : args.substr(0, semi);
    std::string attrs = semi == std::string::npos ? "" : args.substr(semi + 1);
    for (std::string in : SplitList(ins, ',')) {
        OpSchema::Input input;
        size_t colon = in.find(':');
        if (colon != std::string::npos) {
            std::string dt = Trim(in.substr(colon + 1));
            try {
                input.dtype = static_cast<int>(ParseDataType(dt));
            } catch (const std::invalid_argument&) {
                fail("input '" + in + "' has unknown dtype '" + dt + "'");
            }
            in = Trim(in.substr(0, colon));
        }
        // `!` goes before or after the `...` / `?` marker (`xs!...`, `x?!`).
        auto strip_written = [&] {
            if (!in.empty() && in.back() == '!') {
                input.written = true;
                in.pop_back();
            }
        };
        strip_written();
        if (in.size() > 3 && in.compare(in.size() - 3, 3, "...") == 0) {
            input.variadic = true;
            in.resize(in.size() - 3);
        } else if (!in.empty() && in.back() == '?') {
            input.optional = true;
            in.pop_back();
        }
        if (!input.written) strip_written();
        if (!IsIdentifier(in, false)) fail("bad input '" + in + "'");
        if (!s.inputs.empty() && (s.inputs.back().variadic || (s.inputs.back().optional && !input.optional))) {
            fail("only the last inputs may be optional or variadic");
        }
        input.name = in;
        if (input.written) s.inplace.push_back(static_cast<int>(s.inputs.size()));
        s.inputs.push_back(input);
    }
    if (s.inputs.empty()) fail("an op needs at least one input");
    for (const OpSchema::Input& in : s.inputs) {
        if (!in.optional) s.min_inputs += 1;
    }
    s.max_inputs = s.inputs.back().variadic ? -1 : static_cast<int>(s.inputs.size());
    while (s.typed_input < static_cast<int>(s.inputs.size()) - 1 && s.inputs[s.typed_input].dtype >= 0) {
        s.typed_input += 1;
    }
    for (const std::string& a : SplitList(attrs, ',')) {
        size_t colon = a.find(':');
        if (colon == std::string::npos) fail("attribute '" + a + "' needs a type (name: int|float|ints|str)");
        std::string name = Trim(a.substr(0, colon)), type = Trim(a.substr(colon + 1));
        if (!IsIdentifier(name, false)) fail("bad attribute name '" + name + "'");
        AttrType t = AttrType::kInt;
        if (type == "int") {
            t = AttrType::kInt;
        } else if (type == "float") {
            t = AttrType::kFloat;
        } else if (type == "ints") {
            t = AttrType::kInts;
        } else if (type == "str") {
            t = AttrType::kStr;
        } else {
            fail("attribute '" + name + "' has unknown type '" + type + "'");
        }
        s.attrs.push_back({name, t});
    }
    std::string outs = Trim(text.substr(arrow + 2));
    if (!outs.empty() && outs.front() == '(') {
        if (outs.back() != ')') fail("unbalanced parentheses in the outputs");
        outs = outs.substr(1, outs.size() - 2);
    }
    for (const std::string& o : SplitList(outs, ',')) {
        std::string name = o.size() > 3 && o.compare(o.size() - 3, 3, "...") == 0 ? o.substr(0, o.size() - 3) : o;
        if (!IsIdentifier(name, false)) fail("bad output '" + o + "'");
        s.outputs.push_back(o);
    }
    s.tier = def.tier;
    s.dtypes = def.dtypes;
    s.backward = SplitList(std::string(def.backward), ' ');
    s.backward.erase(std::remove(s.backward.begin(), s.backward.end(), ""), s.backward.end());
    s.shape = def.shape;
    s.doc = def.doc;
    if (!s.shape) fail("no shape rule");
    return s;
}

std::vector<int> OpSchema::Written(int num_inputs) const {
    std::vector<int> out;
    for (int k : inplace) {
        if (k >= num_inputs) break;
        if (!inputs[k].variadic) {
            out.push_back(k);
            continue;
        }
        for (int j = k; j < num_inputs; ++j) out.push_back(j);
    }
    return out;
}

const char* HowRunsName(HowRuns how) {
    switch (how) {
        case HowRuns::kNative:
            return "native";
        case HowRuns::kComposite:
            return "composite";
        case HowRuns::kCpuFallback:
            return "cpu-fallback";
        case HowRuns::kMissing:
            return "missing";
    }
    return "?";
}

// ---- the registry ----

class OpRegistry {
public:
    static OpRegistry& Get() {
        static OpRegistry* r = new OpRegistry();  // lives for the process
        return *r;
    }

    Op* Find(const std::string& name) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = by_name_.find(name);
        return it == by_name_.end() ? nullptr : it->second;
    }

    std::vector<const Op*> All() {
        std::lock_guard<std::mutex> lock(mu_);
        return std::vector<const Op*>(ops_.begin(), ops_.end());
    }

    void Add(OpSchema s) {
        std::lock_guard<std::mutex> lock(mu_);
        if (by_name_.count(s.name)) throw std::invalid_argument("op '" + s.name + "' is defined twice");
        for (const std::string& b : s.backward) {
            if (!by_name_.count(b) && b != s.name) {
                throw std::invalid_argument("op '" + s.name + "': backward op '" + b + "' is not an op");
            }
        }
        Op* op = new Op(std::move(s));  // lives for the process
        ops_.push_back(op);
        by_name_[op->name()] = op;
    }

    void AddError(std::string e) {
        std::lock_guard<std::mutex> lock(mu_);
        errors_.push_back(std::move(e));
    }

    std::vector<std::string> Errors() {
        std::lock_guard<std::mutex> lock(mu_);
        return errors_;
    }

    std::mutex& mu() { return mu_; }

private:
    OpRegistry() {
        // The table's backward lists may name ops defined further down: add every op, then check.
        std::vector<OpSchema> schemas;
        for (size_t i = 0; i < kOpTableSize; ++i) {
            try {
                schemas.push_back(ParseOpSchema(kOpTable[i]));
            } catch (const std::exception& e) {
                errors_.push_back(e.what());
            }
        }
        for (OpSchema& s : schemas) {
            Op* op = new Op(std::move(s));
            if (by_name_.count(op->name())) errors_.push_back(std::string("op '") + op->name() + "' is defined twice");
            ops_.push_back(op);
            by_name_[op->name()] = op;
        }
        for (const Op* op : ops_) {
            for (const std::string& b : op->schema().backward) {
                if (!by_name_.count(b)) {
                    errors_.push_back("op '" + op->schema().name + "': backward op '" + b + "' is not an op");
                }
            }
        }
    }

    std::mutex mu_;
    std::map<std::string, Op*> by_name_;
    std::vector<Op*> ops_;
    std::vector<std::string> errors_;
};

namespace {

std::atomic<bool> g_poison{false};
constexpr size_t kGuardBytes = 64;
constexpr unsigned char kGuardByte = 0xa5;
std::atomic<int> g_matmul_precision{static_cast<int>(MatmulPrecision::kHighest)};
std::atomic<bool> g_fallback[kNumDeviceTypes];
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
    KernelContext ctx{hin, hout, attrs, cpu, Stream(), &op};
    op.Kernel(DeviceType::kCPU)(ctx);
    for (size_t k = 0; k < out.size(); ++k) hout[k].CopyTo(out[k]);
    for (int k : op.schema().Written(static_cast<int>(in.size()))) hin[k].CopyTo(in[k]);
}

}  // namespace

double KernelContext::f(size_t k) const {
    const AttrValue& v = attrs[k];
    if (const int64_t* p = std::get_if<int64_t>(&v)) return static_cast<double>(*p);
    return std::get<double>(v);
}

void AddOp(const OpDef& def) { OpRegistry::Get().Add(ParseOpSchema(def)); }

void RegisterKernel(DeviceType type, const char* op, KernelFn fn, const char* site) {
    OpRegistry& r = OpRegistry::Get();
    Op* o = r.Find(op);
    if (!o) {
        r.AddError(std::string("kernel registered at ") + site + " for unknown op '" + op + "'");
        return;
    }
    std::string error;
    {
        std::lock_guard<std::mutex> lock(r.mu());
        int t = static_cast<int>(type);
        if (o->kernels_[t]) {
            error = std::string("op '") + op + "' has two kernels for device type " + std::to_string(t) +
                    ": registered at " + o->sites_[t] + " and at " + site;
        } else {
            o->kernels_[t] = fn;
            o->sites_[t] = site;
        }
    }
    if (!error.empty()) r.AddError(error);
}

void CheckRegistrations() {
    std::vector<std::string> errors = OpRegistry::Get().Errors();
    if (errors.empty()) return;
    std::string msg = "op registration failed:";
    for (const std::string& e : errors) msg += "\n  " + e;
    throw std::runtime_error(msg);
}

const Op& GetOp(const std::string& name) { return GetMutableOp(name); }

Op& GetMutableOp(const std::string& name) {
    Op* op = OpRegistry::Get().Find(name);
    if (!op) throw std::invalid_argument("unknown op '" + name + "' (see docs/ops.md for the list)");
    return *op;
}

void RunKernelOf(const char* name, const KernelContext& ctx, const std::vector<Tensor>& in, std::vector<Tensor>& out,
                 const Attrs& attrs) {
    const Op& op = GetOp(name);
    KernelFn fn = op.Kernel(ctx.device.type);
    if (!fn)
        throw MissingKernelError(std::string("op '") + name + "' has no kernel for device " + ctx.device.ToString());
    KernelContext sub{in, out, attrs, ctx.device, ctx.stream, &op};
    fn(sub);
}

std::vector<const Op*> AllOps() { return OpRegistry::Get().All(); }

void SetPoisonOutputs(bool on) { g_poison = on; }
void SetFloat32MatmulPrecision(MatmulPrecision p) { g_matmul_precision.store(static_cast<int>(p)); }
MatmulPrecision Float32MatmulPrecision() { return static_cast<MatmulPrecision>(g_matmul_precision.load()); }
bool PoisonOutputs() { return g_poison; }
void SetCpuFallback(DeviceType type, bool on) { g_fallback[static_cast<int>(type)] = on; }
bool CpuFallback(DeviceType type) { return g_fallback[static_cast<int>(type)]; }
void SetWarningHandler(std::function<void(const std::string&)> handler) { g_warn = std::move(handler); }

// ---- the dispatcher ----

void Op::SetComposite(CompositeFn fn) {
    std::lock_guard<std::mutex> lock(OpRegistry::Get().mu());
    if (composite_) throw std::runtime_error("op '" + schema_.name + "' already has a composite");
    composite_ = std::move(fn);
}

HowRuns Op::How(DeviceType t) const {
    if (prefer_composite_.load(std::memory_order_relaxed)) return HowRuns::kComposite;
    if (HasKernel(t)) return HowRuns::kNative;
    if (composite_) return HowRuns::kComposite;
    if (CpuFallback(t) && HasKernel(DeviceType::kCPU)) return HowRuns::kCpuFallback;
    return HowRuns::kMissing;
}

std::vector<TensorMeta> Op::Meta(const std::vector<Tensor>& in, const Attrs& attrs) const {
    const char* op = name();
    int n = static_cast<int>(in.size());
    if (n < schema_.min_inputs || (schema_.max_inputs >= 0 && n > schema_.max_inputs)) {
        std::string names;
        for (const OpSchema::Input& i : schema_.inputs) {
            names += (names.empty() ? "" : ", ") + i.name + (i.optional ? "?" : i.variadic ? "..." : "");
        }
        OpError(op, "expected inputs (" + names + "), got " + std::to_string(n) + " tensor(s)");
    }
    for (int k = 0; k < n; ++k) {
        if (!in[k].defined()) OpError(op, "input " + std::to_string(k) + " is undefined");
    }
    for (int k = 0; k < n && k < static_cast<int>(schema_.inputs.size()); ++k) {
        const OpSchema::Input& s = schema_.inputs[k];
        if (s.dtype >= 0 && in[k].dtype() != static_cast<DataType>(s.dtype)) {
            OpError(op, s.name + " must be " + DataTypeName(static_cast<DataType>(s.dtype)) + ", got " +
                            DataTypeName(in[k].dtype()));
        }
    }
    const Tensor& typed = in[std::min(schema_.typed_input, n - 1)];
    if (!(DtypeBit(typed.dtype()) & schema_.dtypes)) {
        if (IsFloat8(typed.dtype())) {
            OpError(op, schema_.inputs[schema_.typed_input].name + " is " + DataTypeName(typed.dtype()) +
                            ": float8 tensors hold FP8 GEMM operands; cast to a wider float first (.float())");
        }
        std::string names = DtypeSetName(schema_.dtypes);
        size_t last = names.rfind(' ');
        if (last != std::string::npos) names.replace(last, 1, " or ");
        for (size_t p = names.find(' '); p != std::string::npos && p < names.rfind(" or ");
             p = names.find(' ', p + 2)) {
            names.replace(p, 1, ", ");
        }
        OpError(op, schema_.inputs[schema_.typed_input].name + " must be " + names + ", got " +
                        DataTypeName(typed.dtype()));
    }
    if (attrs.size() != schema_.attrs.size()) {
        std::string names;
        for (const OpSchema::Attr& a : schema_.attrs) names += (names.empty() ? "" : ", ") + a.name;
        OpError(op, "expected " + std::to_string(schema_.attrs.size()) + " attribute(s) (" + names + "), got " +
                        std::to_string(attrs.size()));
    }
    for (size_t k = 0; k < attrs.size(); ++k) {
        const OpSchema::Attr& a = schema_.attrs[k];
        if (!AttrMatches(a.type, attrs[k])) OpError(op, "attribute '" + a.name + "' must be " + AttrTypeName(a.type));
    }
    try {
        return schema_.shape(op, in, attrs);
    } catch (const std::invalid_argument& e) {
        // Shared helpers may leave the op's name out; add it.
        std::string msg = e.what(), prefix = schema_.name + ":";
        if (msg.rfind(prefix, 0) == 0) throw;
        throw std::invalid_argument(prefix + " " + msg);
    }
}

std::vector<Tensor> Op::Call(const std::vector<Tensor>& in, const Attrs& attrs) const {
    std::vector<TensorMeta> metas = Meta(in, attrs);
    const Device& device = in[0].device();
    for (size_t k = 1; k < in.size(); ++k) {
        if (in[k].device() != device) {
            OpError(name(), "expected all inputs on one device, got " + device.ToString() + " (input 0) and " +
                                in[k].device().ToString() + " (input " + std::to_string(k) + ")");
        }
    }
    KernelFn fn = kernels_[static_cast<int>(device.type)];
    if (fn && !prefer_composite_.load(std::memory_order_relaxed)) return RunKernel(fn, device, in, metas, attrs);
    return RunWithoutKernel(device, in, metas, attrs);
}

std::vector<Tensor> Op::RunKernel(KernelFn fn, const Device& device, const std::vector<Tensor>& in,
                                  const std::vector<TensorMeta>& metas, const Attrs& attrs) const {
    DeviceGuard guard(device);
    const Stream stream = CurrentStream(device);
    std::optional<KernelTimer> timer;
    if (ProfilingActive()) timer.emplace(this, stream);
    // Test mode on the cpu (kernels run synchronously there): each output has guard bytes after it, checked after
    // the kernel, so a write past an output's end fails the op instead of corrupting whatever lies there.
    // (Outputs of a GiB or more go unguarded: an out-of-memory error then names the size the op asked for.)
    std::vector<Tensor> out;
    std::vector<bool> guarded;
    out.reserve(metas.size());
    for (const TensorMeta& m : metas) {
        const bool g = g_poison && device.is_cpu() &&
                       Numel(m.shape) < (int64_t{1} << 30) / static_cast<int64_t>(DataTypeSize(m.dtype));
        out.push_back(g ? Tensor::EmptyGuarded(m.shape, m.dtype, device, kGuardBytes)
                        : Tensor::Empty(m.shape, m.dtype, device));
        guarded.push_back(g);
    }
    if (g_poison) {
        // On the kernel's stream, so the fill is ordered before the kernel.
        DeviceRuntime& rt = GetRuntime(device.type);
        for (size_t k = 0; k < out.size(); ++k) {
            Tensor& t = out[k];
            if (t.nbytes()) rt.MemsetAsync(t.data(), 0xff, t.nbytes(), stream);
            if (guarded[k]) std::memset(static_cast<char*>(t.data()) + t.nbytes(), kGuardByte, kGuardBytes);
        }
    }
    for (int k : schema_.Written(static_cast<int>(in.size()))) in[k].storage()->BumpVersion();
    for (const Tensor& t : in) t.storage()->RecordStream(stream);
    KernelContext ctx{in, out, attrs, device, stream, this};
    fn(ctx);
    for (size_t k = 0; k < out.size(); ++k) {
        if (guarded[k]) {
            const unsigned char* g = static_cast<const unsigned char*>(out[k].data()) + out[k].nbytes();
            for (size_t i = 0; i < kGuardBytes; ++i) {
                if (g[i] != kGuardByte) {
                    throw std::logic_error("op '" + schema_.name + "': the cpu kernel wrote past the end of output " +
                                           std::to_string(k) + " (" + out[k].ToString() + "), at byte " +
                                           std::to_string(out[k].nbytes() + i));
                }
            }
        }
    }
    return out;
}

std::vector<Tensor> Op::RunWithoutKernel(const Device& device, const std::vector<Tensor>& in,
                                         const std::vector<TensorMeta>& metas, const Attrs& attrs) const {
    if (composite_) {
        std::vector<Tensor> out = composite_(in, attrs);
        if (out.size() != metas.size()) {
            throw std::logic_error("composite of '" + schema_.name + "' returned " + std::to_string(out.size()) +
                                   " outputs, the schema has " + std::to_string(metas.size()));
        }
        return out;
    }
    if (!CpuFallback(device.type) || !HasKernel(DeviceType::kCPU)) {
        throw MissingKernelError("op '" + schema_.name + "' has no kernel for device " + device.ToString() +
                                 " (provider '" + DeviceTypeName(device.type) + "')");
    }
    if (!warned_fallback_.exchange(true) && g_warn) {
        g_warn("op '" + schema_.name + "' has no " + DeviceTypeName(device.type) +
               " kernel; running it on the CPU (CPU fallback)");
    }
    std::vector<Tensor> out;
    out.reserve(metas.size());
    for (const TensorMeta& m : metas) out.push_back(Tensor::Empty(m.shape, m.dtype, device));
    for (int k : schema_.Written(static_cast<int>(in.size()))) in[k].storage()->BumpVersion();
    RunOnCpu(*this, in, out, attrs);
    return out;
}

std::vector<Tensor> Op::CallComposite(const std::vector<Tensor>& in, const Attrs& attrs) const {
    Meta(in, attrs);
    if (!composite_) throw MissingKernelError("op '" + schema_.name + "' has no composite");
    return composite_(in, attrs);
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
