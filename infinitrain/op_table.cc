// The op table: every op's schema and shape rule. docs/ops.md describes the
// same list for readers; tests/test_op_table.py checks the two agree.
#include <algorithm>
#include <string>

#include "infinitrain/op.h"

namespace infinitrain {
namespace {

using In = std::vector<Tensor>;
using Out = std::vector<TensorMeta>;

constexpr const char* kFloatTypes = "float32 bfloat16 float16 float64";

bool IsComputeFloat(DataType t) { return IsFloating(t); }

// Float statistics (norm stats, log-sum-exp, losses) are float32, or float64 for float64 inputs.
DataType StatType(DataType t) { return t == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32; }

void CheckFloat(const char* op, const Tensor& t, const char* what) {
    if (!IsComputeFloat(t.dtype())) {
        OpError(op,
                std::string(what) + " must be float32, bfloat16, float16 or float64, got " + DataTypeName(t.dtype()));
    }
}

void CheckDtype(const char* op, const Tensor& t, DataType want, const char* what) {
    if (t.dtype() != want) {
        OpError(op, std::string(what) + " must be " + DataTypeName(want) + ", got " + DataTypeName(t.dtype()));
    }
}

void CheckSameDtype(const char* op, const Tensor& a, const Tensor& b) {
    if (a.dtype() != b.dtype()) {
        OpError(op, std::string("dtype mismatch: ") + DataTypeName(a.dtype()) + " and " + DataTypeName(b.dtype()) +
                        " (cast one with .to(dtype))");
    }
}

void CheckSameShape(const char* op, const Tensor& a, const Tensor& b, const char* what) {
    if (a.shape() != b.shape()) {
        OpError(op, std::string(what) + ": shapes " + ShapeToString(a.shape()) + " and " + ShapeToString(b.shape()) +
                        " must be equal");
    }
}

void CheckRank(const char* op, const Tensor& t, int64_t rank, const char* what) {
    if (t.dim() != rank) {
        OpError(op,
                std::string(what) + " must be " + std::to_string(rank) + "-d, got shape " + ShapeToString(t.shape()));
    }
}

void CheckAttrs(const char* op, const Attrs& a, size_t n, const char* names) {
    if (a.size() != n) {
        OpError(op, "expected " + std::to_string(n) + " attribute(s) (" + names + "), got " + std::to_string(a.size()));
    }
}

template <typename T>
const T& Attr(const char* op, const Attrs& a, size_t k, const char* name) {
    const T* p = std::get_if<T>(&a[k]);
    if (!p) {
        const char* kind = std::is_same<T, int64_t>::value                ? "an int"
                           : std::is_same<T, std::vector<int64_t>>::value ? "a list of ints"
                           : std::is_same<T, std::string>::value          ? "a string"
                                                                          : "a float";
        OpError(op, "attribute '" + std::string(name) + "' must be " + kind);
    }
    return *p;
}

double FloatAttr(const char* op, const Attrs& a, size_t k, const char* name) {
    if (const int64_t* p = std::get_if<int64_t>(&a[k])) return static_cast<double>(*p);
    return Attr<double>(op, a, k, name);
}

// Random ops take (seed, offset) as two non-negative ints starting at attribute k.
void CheckSeed(const char* op, const Attrs& a, size_t k) {
    if (Attr<int64_t>(op, a, k, "seed") < 0) OpError(op, "seed must be >= 0");
    if (Attr<int64_t>(op, a, k + 1, "offset") < 0) OpError(op, "offset must be >= 0");
}

// ---- shape rules -----------------------------------------------------------

Out UnaryFloat(const char* op, const In& in) {
    CheckFloat(op, in[0], "x");
    return {{in[0].shape(), in[0].dtype()}};
}

#define META(...) [](const In& in, const Attrs& a) -> Out __VA_ARGS__

Out BinaryFloat(const char* op, const In& in, const Attrs& a) {
    CheckAttrs(op, a, 0, "");
    CheckFloat(op, in[0], "a");
    CheckSameDtype(op, in[0], in[1]);
    return {{BroadcastShapes(op, in[0].shape(), in[1].shape()), in[0].dtype()}};
}

Out Compare(const char* op, const In& in, const Attrs& a) {
    CheckAttrs(op, a, 0, "");
    CheckSameDtype(op, in[0], in[1]);
    DataType t = in[0].dtype();
    if (!IsComputeFloat(t) && t != DataType::kInt64 && t != DataType::kInt32) {
        OpError(op, std::string("inputs must be float or int32/int64, got ") + DataTypeName(t));
    }
    return {{BroadcastShapes(op, in[0].shape(), in[1].shape()), DataType::kBool}};
}

Out UnaryBackward(const char* op, const In& in, const Attrs& a) {
    CheckAttrs(op, a, 0, "");
    CheckFloat(op, in[0], "input");
    CheckSameDtype(op, in[0], in[1]);
    CheckSameShape(op, in[0], in[1], "input and grad");
    return {{in[0].shape(), in[0].dtype()}};
}

Shape ReduceShape(const char* op, const Shape& s, const std::vector<int64_t>& dims, bool keepdim) {
    int64_t n = static_cast<int64_t>(s.size());
    std::vector<bool> reduce(n, dims.empty());
    for (int64_t d : dims) {
        int64_t nd = NormalizeDim(op, d, n);
        if (reduce[nd]) OpError(op, "dim " + std::to_string(d) + " repeated in dims");
        reduce[nd] = true;
    }
    Shape out;
    for (int64_t i = 0; i < n; ++i) {
        if (!reduce[i]) {
            out.push_back(s[i]);
        } else if (keepdim) {
            out.push_back(1);
        }
    }
    return out;
}

Out Reduce(const char* op, const In& in, const Attrs& a) {
    CheckAttrs(op, a, 2, "dims, keepdim");
    CheckFloat(op, in[0], "x");
    const auto& dims = Attr<std::vector<int64_t>>(op, a, 0, "dims");
    bool keep = Attr<int64_t>(op, a, 1, "keepdim") != 0;
    Shape out = ReduceShape(op, in[0].shape(), dims, keep);
    if (std::string(op) == "amax" && in[0].numel() == 0 && Numel(out) > 0) {
        OpError(op, "cannot take the max over an empty dimension");
    }
    return {{out, in[0].dtype()}};
}

Out Softmax(const char* op, const In& in, const Attrs& a, int grad_inputs) {
    CheckAttrs(op, a, 1, "dim");
    CheckFloat(op, in[0], "x");
    NormalizeDim(op, Attr<int64_t>(op, a, 0, "dim"), in[0].dim());
    if (grad_inputs) {
        CheckSameDtype(op, in[0], in[1]);
        CheckSameShape(op, in[0], in[1], "out and grad");
    }
    return {{in[0].shape(), in[0].dtype()}};
}

Shape MatmulShape(const char* op, const Tensor& a, const Tensor& b, bool ta, bool tb) {
    if (a.dim() < 2 || b.dim() < 2) {
        OpError(op,
                "inputs must be at least 2-d, got " + ShapeToString(a.shape()) + " and " + ShapeToString(b.shape()));
    }
    int64_t m = ta ? a.size(-1) : a.size(-2), ka = ta ? a.size(-2) : a.size(-1);
    int64_t kb = tb ? b.size(-1) : b.size(-2), n = tb ? b.size(-2) : b.size(-1);
    if (ka != kb) {
        OpError(op, "inner dimensions differ: " + ShapeToString(a.shape()) + (ta ? "^T" : "") + " @ " +
                        ShapeToString(b.shape()) + (tb ? "^T" : ""));
    }
    Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
    Shape out = BroadcastShapes(op, ba, bb);
    out.push_back(m);
    out.push_back(n);
    return out;
}

Out Concat(const char* op, const In& in, const Attrs& a, bool stack) {
    CheckAttrs(op, a, 1, "dim");
    const Tensor& x0 = in[0];
    int64_t nd = x0.dim() + (stack ? 1 : 0);
    if (nd == 0) OpError(op, "cannot concatenate 0-d tensors (use stack)");
    int64_t dim = NormalizeDim(op, Attr<int64_t>(op, a, 0, "dim"), nd);
    Shape out = x0.shape();
    int64_t total = 0;
    for (size_t k = 0; k < in.size(); ++k) {
        CheckSameDtype(op, x0, in[k]);
        if (stack) {
            CheckSameShape(op, x0, in[k], "stacked tensors");
            continue;
        }
        if (in[k].dim() != x0.dim()) OpError(op, "all inputs must have the same number of dimensions");
        for (int64_t d = 0; d < nd; ++d) {
            if (d != dim && in[k].shape()[d] != out[d]) {
                OpError(op, "shapes " + ShapeToString(x0.shape()) + " and " + ShapeToString(in[k].shape()) +
                                " differ outside dim " + std::to_string(dim));
            }
        }
        total += in[k].shape()[dim];
    }
    if (stack) {
        out.insert(out.begin() + dim, static_cast<int64_t>(in.size()));
    } else {
        out[dim] = total;
    }
    return {{out, x0.dtype()}};
}

struct SliceSpec {
    int64_t dim, start, end, step, len;
};

SliceSpec NormalizeSlice(const char* op, const Shape& s, int64_t dim, int64_t start, int64_t end, int64_t step) {
    SliceSpec r;
    r.dim = NormalizeDim(op, dim, static_cast<int64_t>(s.size()));
    int64_t n = s[r.dim];
    if (step <= 0) OpError(op, "step must be positive, got " + std::to_string(step));
    auto clampi = [n](int64_t v) { return std::min(std::max(v < 0 ? v + n : v, int64_t{0}), n); };
    r.start = clampi(start);
    r.end = std::max(clampi(end), r.start);
    r.step = step;
    r.len = (r.end - r.start + step - 1) / step;
    return r;
}

Out SdpaMeta(const char* op, const In& in, const Attrs& a) {
    CheckAttrs(op, a, 2, "causal, scale");
    Attr<int64_t>(op, a, 0, "causal");
    FloatAttr(op, a, 1, "scale");
    CheckFloat(op, in[0], "q");
    for (int k = 0; k < 3; ++k) CheckRank(op, in[k], 4, "q, k and v");
    CheckSameDtype(op, in[0], in[1]);
    CheckSameDtype(op, in[0], in[2]);
    CheckSameShape(op, in[1], in[2], "k and v");
    const Shape& q = in[0].shape();
    const Shape& k = in[1].shape();
    if (q[0] != k[0] || q[3] != k[3] || k[1] == 0 || q[1] % k[1] != 0) {
        OpError(op, "q " + ShapeToString(q) + " and k " + ShapeToString(k) +
                        " must share batch and head dim, with q heads a multiple of k heads");
    }
    if (Attr<int64_t>(op, a, 0, "causal") && q[2] != k[2]) {
        OpError(op, "causal attention needs equal query and key lengths");
    }
    return {{q, in[0].dtype()}, {Shape{q[0], q[1], q[2]}, StatType(in[0].dtype())}};
}

Out CrossEntropyMeta(const char* op, const In& in, const Attrs& a) {
    CheckAttrs(op, a, 1, "ignore_index");
    Attr<int64_t>(op, a, 0, "ignore_index");
    CheckFloat(op, in[0], "logits");
    CheckRank(op, in[0], 2, "logits");
    CheckDtype(op, in[1], DataType::kInt64, "target");
    if (in[1].shape() != Shape{in[0].size(0)}) {
        OpError(op,
                "target must have shape [" + std::to_string(in[0].size(0)) + "], got " + ShapeToString(in[1].shape()));
    }
    DataType st = StatType(in[0].dtype());
    return {{Shape{}, st}, {Shape{in[0].size(0)}, st}};
}

// Saved statistics: one value per row of x, float32 (float64 for float64 x).
void CheckStats(const char* op, const Tensor& x, const Tensor& st, const char* what) {
    Shape rows(x.shape().begin(), x.shape().end() - 1);
    if (st.shape() != rows) OpError(op, std::string(what) + " must have shape " + ShapeToString(rows));
    CheckDtype(op, st, StatType(x.dtype()), what);
}

std::vector<OpSchema> Schemas() {
    std::vector<OpSchema> t;
    const OpTier R = OpTier::kRequired, F = OpTier::kFused;

    // ---- copy, cast, fill, random ----
    t.push_back({"cast",
                 R,
                 "x",
                 "dtype:str",
                 "out",
                 "all",
                 "cast",
                 "x converted to dtype (floats round to nearest even)",
                 META({
                     CheckAttrs("cast", a, 1, "dtype");
                     return {{in[0].shape(), ParseDataType(Attr<std::string>("cast", a, 0, "dtype"))}};
                 }),
                 1,
                 1,
                 {}});
    t.push_back({"copy_",
                 R,
                 "dst, src",
                 "",
                 "",
                 "all",
                 "",
                 "dst[...] = src, converting dtype; shapes must match",
                 META({
                     CheckAttrs("copy_", a, 0, "");
                     CheckSameShape("copy_", in[0], in[1], "dst and src");
                     return {};
                 }),
                 2,
                 2,
                 {0}});
    t.push_back({"fill_",
                 R,
                 "x",
                 "value:float",
                 "",
                 "all",
                 "",
                 "x[...] = value",
                 META({
                     CheckAttrs("fill_", a, 1, "value");
                     FloatAttr("fill_", a, 0, "value");
                     return {};
                 }),
                 1,
                 1,
                 {0}});
    t.push_back({"normal_",
                 R,
                 "x",
                 "mean:float, std:float, seed:int, offset:int",
                 "",
                 kFloatTypes,
                 "",
                 "x[i] = mean + std * N(0,1), counter-based on (seed, offset + i): the same on every device",
                 META({
                     CheckAttrs("normal_", a, 4, "mean, std, seed, offset");
                     CheckFloat("normal_", in[0], "x");
                     FloatAttr("normal_", a, 0, "mean");
                     if (FloatAttr("normal_", a, 1, "std") < 0) OpError("normal_", "std must be >= 0");
                     CheckSeed("normal_", a, 2);
                     return {};
                 }),
                 1,
                 1,
                 {0}});
    t.push_back({"uniform_",
                 R,
                 "x",
                 "low:float, high:float, seed:int, offset:int",
                 "",
                 kFloatTypes,
                 "",
                 "x[i] = low + (high - low) * U[0,1), counter-based on (seed, offset + i)",
                 META({
                     CheckAttrs("uniform_", a, 4, "low, high, seed, offset");
                     CheckFloat("uniform_", in[0], "x");
                     if (FloatAttr("uniform_", a, 0, "low") > FloatAttr("uniform_", a, 1, "high")) {
                         OpError("uniform_", "low must be <= high");
                     }
                     CheckSeed("uniform_", a, 2);
                     return {};
                 }),
                 1,
                 1,
                 {0}});
    t.push_back({"dropout",
                 R,
                 "x",
                 "p:float, seed:int, offset:int",
                 "out, mask",
                 kFloatTypes,
                 "dropout_backward",
                 "mask[i] = U(seed, offset + i) >= p; out = x * mask / (1 - p)",
                 META({
                     CheckAttrs("dropout", a, 3, "p, seed, offset");
                     CheckFloat("dropout", in[0], "x");
                     double p = FloatAttr("dropout", a, 0, "p");
                     if (!(p >= 0.0 && p < 1.0)) OpError("dropout", "p must be in [0, 1), got " + std::to_string(p));
                     CheckSeed("dropout", a, 1);
                     return {{in[0].shape(), in[0].dtype()}, {in[0].shape(), DataType::kBool}};
                 }),
                 1,
                 1,
                 {}});
    t.push_back({"dropout_backward",
                 R,
                 "grad, mask",
                 "p:float",
                 "dx",
                 kFloatTypes,
                 "",
                 "dx = grad * mask / (1 - p)",
                 META({
                     CheckAttrs("dropout_backward", a, 1, "p");
                     double p = FloatAttr("dropout_backward", a, 0, "p");
                     if (!(p >= 0.0 && p < 1.0)) {
                         OpError("dropout_backward", "p must be in [0, 1), got " + std::to_string(p));
                     }
                     CheckFloat("dropout_backward", in[0], "grad");
                     CheckDtype("dropout_backward", in[1], DataType::kBool, "mask");
                     CheckSameShape("dropout_backward", in[0], in[1], "grad and mask");
                     return {{in[0].shape(), in[0].dtype()}};
                 }),
                 2,
                 2,
                 {}});

    // ---- elementwise unary ----
    struct Unary {
        const char* name;
        const char* backward;
        const char* doc;
    };
    const Unary unary[] = {
        {"neg", "neg", "-x"},
        {"exp", "mul", "e^x"},
        {"log", "div", "natural log"},
        {"sqrt", "div", "square root"},
        {"rsqrt", "mul", "1 / sqrt(x)"},
        {"abs", "mul", "|x|"},
        {"sin", "cos", "sine"},
        {"cos", "sin", "cosine"},
        {"tanh", "tanh_backward", "hyperbolic tangent"},
        {"sigmoid", "sigmoid_backward", "1 / (1 + e^-x)"},
        {"relu", "relu_backward", "max(x, 0)"},
        {"silu", "silu_backward", "x * sigmoid(x)"},
        {"gelu_tanh", "gelu_tanh_backward", "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"},
    };
    for (const Unary& u : unary) {
        bool fused = std::string(u.name) == "gelu_tanh" || std::string(u.name) == "silu";
        t.push_back({u.name, fused ? F : R, "x", "", "out", kFloatTypes, u.backward, u.doc, nullptr, 1, 1, {}});
    }
    for (OpSchema& s : t) {
        if (!s.meta) {
            s.meta = [](const In& in, const Attrs& a) -> Out {
                if (!a.empty()) OpError("", "takes no attributes");
                return UnaryFloat("", in);
            };
        }
    }
    t.push_back({"affine",
                 R,
                 "x",
                 "scale:float, bias:float",
                 "out",
                 kFloatTypes,
                 "affine",
                 "x * scale + bias (scalar arithmetic)",
                 META({
                     CheckAttrs("affine", a, 2, "scale, bias");
                     FloatAttr("affine", a, 0, "scale");
                     FloatAttr("affine", a, 1, "bias");
                     return UnaryFloat("affine", in);
                 }),
                 1,
                 1,
                 {}});
    t.push_back({"pow_scalar",
                 R,
                 "x",
                 "exponent:float",
                 "out",
                 kFloatTypes,
                 "pow_scalar, mul",
                 "x ^ exponent",
                 META({
                     CheckAttrs("pow_scalar", a, 1, "exponent");
                     FloatAttr("pow_scalar", a, 0, "exponent");
                     return UnaryFloat("pow_scalar", in);
                 }),
                 1,
                 1,
                 {}});
    t.push_back({"clamp",
                 R,
                 "x",
                 "low:float, high:float",
                 "out",
                 kFloatTypes,
                 "ge, le, mul",
                 "min(max(x, low), high)",
                 META({
                     CheckAttrs("clamp", a, 2, "low, high");
                     if (FloatAttr("clamp", a, 0, "low") > FloatAttr("clamp", a, 1, "high")) {
                         OpError("clamp", "low must be <= high");
                     }
                     return UnaryFloat("clamp", in);
                 }),
                 1,
                 1,
                 {}});
    const char* unary_bw[][2] = {{"tanh_backward", "grad * (1 - out^2), from (out, grad)"},
                                 {"sigmoid_backward", "grad * out * (1 - out), from (out, grad)"},
                                 {"relu_backward", "grad * (x > 0), from (x, grad)"},
                                 {"silu_backward", "grad * d silu(x)/dx, from (x, grad)"},
                                 {"gelu_tanh_backward", "grad * d gelu_tanh(x)/dx, from (x, grad)"}};
    for (auto& u : unary_bw) {
        bool fused = std::string(u[0]).rfind("silu", 0) == 0 || std::string(u[0]).rfind("gelu", 0) == 0;
        t.push_back({u[0],
                     fused ? F : R,
                     "x_or_out, grad",
                     "",
                     "dx",
                     kFloatTypes,
                     "",
                     u[1],
                     META({ return UnaryBackward("", in, a); }),
                     2,
                     2,
                     {}});
    }

    // ---- elementwise binary (broadcasting) ----
    const char* binary[][3] = {
        {"add", "sum", "a + b"},           {"sub", "sum, neg", "a - b"},        {"mul", "mul, sum", "a * b"},
        {"div", "div, mul, sum", "a / b"}, {"maximum", "ge, mul", "max(a, b)"}, {"minimum", "le, mul", "min(a, b)"}};
    for (auto& b : binary) {
        t.push_back(
            {b[0], R, "a, b", "", "out", kFloatTypes, b[1], b[2], META({ return BinaryFloat("", in, a); }), 2, 2, {}});
    }
    const char* compare[][2] = {{"eq", "a == b"}, {"ne", "a != b"}, {"lt", "a < b"},
                                {"le", "a <= b"}, {"gt", "a > b"},  {"ge", "a >= b"}};
    for (auto& c : compare) {
        t.push_back({c[0],
                     R,
                     "a, b",
                     "",
                     "out (bool)",
                     "float32 bfloat16 float16 float64 int32 int64",
                     "",
                     c[1],
                     META({ return Compare("", in, a); }),
                     2,
                     2,
                     {}});
    }
    t.push_back({"where",
                 R,
                 "cond, a, b",
                 "",
                 "out",
                 kFloatTypes,
                 "where",
                 "cond ? a : b, all three broadcast",
                 META({
                     CheckAttrs("where", a, 0, "");
                     CheckDtype("where", in[0], DataType::kBool, "cond");
                     CheckFloat("where", in[1], "a");
                     CheckSameDtype("where", in[1], in[2]);
                     Shape s = BroadcastShapes("where", in[0].shape(), in[1].shape());
                     return {{BroadcastShapes("where", s, in[2].shape()), in[1].dtype()}};
                 }),
                 3,
                 3,
                 {}});
    t.push_back({"masked_fill",
                 R,
                 "x, mask",
                 "value:float",
                 "out",
                 kFloatTypes,
                 "masked_fill",
                 "mask ? value : x; mask (bool) broadcasts to x's shape",
                 META({
                     CheckAttrs("masked_fill", a, 1, "value");
                     FloatAttr("masked_fill", a, 0, "value");
                     CheckFloat("masked_fill", in[0], "x");
                     CheckDtype("masked_fill", in[1], DataType::kBool, "mask");
                     if (BroadcastShapes("masked_fill", in[0].shape(), in[1].shape()) != in[0].shape()) {
                         OpError("masked_fill", "mask " + ShapeToString(in[1].shape()) + " must broadcast to x " +
                                                    ShapeToString(in[0].shape()));
                     }
                     return {{in[0].shape(), in[0].dtype()}};
                 }),
                 2,
                 2,
                 {}});
    t.push_back({"axpy_",
                 R,
                 "y, x",
                 "alpha:float",
                 "",
                 kFloatTypes,
                 "",
                 "y += alpha * x (same shape and dtype)",
                 META({
                     CheckAttrs("axpy_", a, 1, "alpha");
                     FloatAttr("axpy_", a, 0, "alpha");
                     CheckFloat("axpy_", in[0], "y");
                     CheckSameDtype("axpy_", in[0], in[1]);
                     CheckSameShape("axpy_", in[0], in[1], "y and x");
                     return {};
                 }),
                 2,
                 2,
                 {0}});

    // ---- reductions ----
    t.push_back({"sum",
                 R,
                 "x",
                 "dims:ints, keepdim:int",
                 "out",
                 kFloatTypes,
                 "expand (Python)",
                 "sum over dims (all when empty)",
                 META({ return Reduce("sum", in, a); }),
                 1,
                 1,
                 {}});
    t.push_back({"mean",
                 R,
                 "x",
                 "dims:ints, keepdim:int",
                 "out",
                 kFloatTypes,
                 "expand (Python)",
                 "mean over dims (all when empty)",
                 META({ return Reduce("mean", in, a); }),
                 1,
                 1,
                 {}});
    t.push_back({"amax",
                 R,
                 "x",
                 "dims:ints, keepdim:int",
                 "out",
                 kFloatTypes,
                 "eq, div",
                 "max over dims (all when empty)",
                 META({ return Reduce("amax", in, a); }),
                 1,
                 1,
                 {}});
    t.push_back({"argmax",
                 R,
                 "x",
                 "dim:int, keepdim:int",
                 "out (int64)",
                 kFloatTypes,
                 "",
                 "index of the first maximum along dim",
                 META({
                     CheckAttrs("argmax", a, 2, "dim, keepdim");
                     CheckFloat("argmax", in[0], "x");
                     int64_t d = Attr<int64_t>("argmax", a, 0, "dim");
                     bool keep = Attr<int64_t>("argmax", a, 1, "keepdim") != 0;
                     NormalizeDim("argmax", d, in[0].dim());
                     if (in[0].size(d) == 0) OpError("argmax", "cannot take argmax over an empty dimension");
                     return {{ReduceShape("argmax", in[0].shape(), {d}, keep), DataType::kInt64}};
                 }),
                 1,
                 1,
                 {}});
    t.push_back({"sum_squares",
                 R,
                 "x",
                 "",
                 "out (0-d, float32 or float64)",
                 kFloatTypes,
                 "",
                 "sum of x^2 over all elements, accumulated in float64 (gradient norms)",
                 META({
                     CheckAttrs("sum_squares", a, 0, "");
                     CheckFloat("sum_squares", in[0], "x");
                     return {{Shape{}, StatType(in[0].dtype())}};
                 }),
                 1,
                 1,
                 {}});

    // ---- linear algebra ----
    t.push_back({"matmul",
                 R,
                 "a, b",
                 "trans_a:int, trans_b:int",
                 "out",
                 kFloatTypes,
                 "matmul, sum",
                 "op(a) @ op(b) over the last two dims, batch dims broadcast; op transposes when trans_* is 1",
                 META({
                     CheckAttrs("matmul", a, 2, "trans_a, trans_b");
                     CheckFloat("matmul", in[0], "a");
                     CheckSameDtype("matmul", in[0], in[1]);
                     bool ta = Attr<int64_t>("matmul", a, 0, "trans_a") != 0;
                     bool tb = Attr<int64_t>("matmul", a, 1, "trans_b") != 0;
                     return {{MatmulShape("matmul", in[0], in[1], ta, tb), in[0].dtype()}};
                 }),
                 2,
                 2,
                 {}});
    t.push_back({"linear",
                 R,
                 "x, weight, bias?",
                 "",
                 "out",
                 kFloatTypes,
                 "matmul, sum",
                 "x[..., in] @ weight[out, in]^T + bias[out]",
                 META({
                     CheckAttrs("linear", a, 0, "");
                     CheckFloat("linear", in[0], "x");
                     CheckSameDtype("linear", in[0], in[1]);
                     CheckRank("linear", in[1], 2, "weight");
                     if (in[0].dim() < 1 || in[0].size(-1) != in[1].size(1)) {
                         OpError("linear", "x " + ShapeToString(in[0].shape()) + " does not match weight " +
                                               ShapeToString(in[1].shape()) + " (expected x[..., " +
                                               std::to_string(in[1].size(1)) + "])");
                     }
                     if (in.size() == 3) {
                         CheckSameDtype("linear", in[0], in[2]);
                         if (in[2].shape() != Shape{in[1].size(0)}) {
                             OpError("linear", "bias must have shape [" + std::to_string(in[1].size(0)) + "], got " +
                                                   ShapeToString(in[2].shape()));
                         }
                     }
                     Shape s = in[0].shape();
                     s.back() = in[1].size(0);
                     return {{s, in[0].dtype()}};
                 }),
                 2,
                 3,
                 {}});

    // ---- indexing and shape ----
    t.push_back({"embedding",
                 R,
                 "weight, index",
                 "",
                 "out",
                 kFloatTypes,
                 "embedding_backward",
                 "weight[index]: weight [V, C], index int64 [...] -> [..., C]",
                 META({
                     CheckAttrs("embedding", a, 0, "");
                     CheckFloat("embedding", in[0], "weight");
                     CheckRank("embedding", in[0], 2, "weight");
                     CheckDtype("embedding", in[1], DataType::kInt64, "index");
                     Shape s = in[1].shape();
                     s.push_back(in[0].size(1));
                     return {{s, in[0].dtype()}};
                 }),
                 2,
                 2,
                 {}});
    t.push_back({"embedding_backward",
                 R,
                 "grad, index",
                 "num_weights:int",
                 "dweight",
                 kFloatTypes,
                 "",
                 "dweight[V, C] = sum of grad rows scattered to their index",
                 META({
                     CheckAttrs("embedding_backward", a, 1, "num_weights");
                     CheckFloat("embedding_backward", in[0], "grad");
                     CheckDtype("embedding_backward", in[1], DataType::kInt64, "index");
                     Shape s = in[1].shape();
                     s.push_back(in[0].dim() ? in[0].size(-1) : 0);
                     if (s != in[0].shape()) {
                         OpError("embedding_backward",
                                 "grad " + ShapeToString(in[0].shape()) + " must be index's shape plus [C]");
                     }
                     int64_t v = Attr<int64_t>("embedding_backward", a, 0, "num_weights");
                     if (v < 0) OpError("embedding_backward", "num_weights must be >= 0");
                     return {{Shape{v, in[0].size(-1)}, in[0].dtype()}};
                 }),
                 2,
                 2,
                 {}});
    t.push_back({"gather",
                 R,
                 "x, index",
                 "dim:int",
                 "out",
                 kFloatTypes,
                 "scatter_add",
                 "out[..i..] = x[..index[..i..]..] along dim; index int64 with x's rank",
                 META({
                     CheckAttrs("gather", a, 1, "dim");
                     CheckFloat("gather", in[0], "x");
                     CheckDtype("gather", in[1], DataType::kInt64, "index");
                     int64_t d = NormalizeDim("gather", Attr<int64_t>("gather", a, 0, "dim"), in[0].dim());
                     if (in[1].dim() != in[0].dim()) OpError("gather", "index must have x's number of dimensions");
                     for (int64_t k = 0; k < in[0].dim(); ++k) {
                         if (k != d && in[1].size(k) != in[0].size(k)) {
                             OpError("gather", "index " + ShapeToString(in[1].shape()) + " must match x " +
                                                   ShapeToString(in[0].shape()) + " outside dim " + std::to_string(d));
                         }
                     }
                     return {{in[1].shape(), in[0].dtype()}};
                 }),
                 2,
                 2,
                 {}});
    t.push_back({"scatter_add",
                 R,
                 "x, index, src",
                 "dim:int",
                 "out",
                 kFloatTypes,
                 "gather",
                 "out = x; out[..index[..i..]..] += src[..i..] along dim; index and src share a shape",
                 META({
                     CheckAttrs("scatter_add", a, 1, "dim");
                     CheckFloat("scatter_add", in[0], "x");
                     CheckDtype("scatter_add", in[1], DataType::kInt64, "index");
                     CheckSameDtype("scatter_add", in[0], in[2]);
                     CheckSameShape("scatter_add", in[1], in[2], "index and src");
                     int64_t d = NormalizeDim("scatter_add", Attr<int64_t>("scatter_add", a, 0, "dim"), in[0].dim());
                     if (in[1].dim() != in[0].dim()) OpError("scatter_add", "index must have x's number of dimensions");
                     for (int64_t k = 0; k < in[0].dim(); ++k) {
                         if (k != d && in[1].size(k) != in[0].size(k)) {
                             OpError("scatter_add", "index must match x outside dim " + std::to_string(d));
                         }
                     }
                     return {{in[0].shape(), in[0].dtype()}};
                 }),
                 3,
                 3,
                 {}});
    t.push_back({"permute",
                 R,
                 "x",
                 "dims:ints",
                 "out",
                 "all",
                 "permute",
                 "out = x with dimensions reordered (a contiguous copy)",
                 META({
                     CheckAttrs("permute", a, 1, "dims");
                     const auto& dims = Attr<std::vector<int64_t>>("permute", a, 0, "dims");
                     int64_t n = in[0].dim();
                     if (static_cast<int64_t>(dims.size()) != n) {
                         OpError("permute", "dims must list all " + std::to_string(n) + " dimensions");
                     }
                     std::vector<bool> seen(n, false);
                     Shape s(n);
                     for (int64_t k = 0; k < n; ++k) {
                         int64_t d = NormalizeDim("permute", dims[k], n);
                         if (seen[d])
                             OpError("permute", "dims must be a permutation, " + std::to_string(d) + " repeats");
                         seen[d] = true;
                         s[k] = in[0].shape()[d];
                     }
                     return {{s, in[0].dtype()}};
                 }),
                 1,
                 1,
                 {}});
    t.push_back({"slice",
                 R,
                 "x",
                 "dim:int, start:int, end:int, step:int",
                 "out",
                 "all",
                 "slice_backward",
                 "x[start:end:step] along dim (Python slice rules, step > 0)",
                 META({
                     CheckAttrs("slice", a, 4, "dim, start, end, step");
                     SliceSpec sp =
                         NormalizeSlice("slice", in[0].shape(), Attr<int64_t>("slice", a, 0, "dim"),
                                        Attr<int64_t>("slice", a, 1, "start"), Attr<int64_t>("slice", a, 2, "end"),
                                        Attr<int64_t>("slice", a, 3, "step"));
                     Shape s = in[0].shape();
                     s[sp.dim] = sp.len;
                     return {{s, in[0].dtype()}};
                 }),
                 1,
                 1,
                 {}});
    t.push_back({"slice_backward",
                 R,
                 "grad",
                 "shape:ints, dim:int, start:int, end:int, step:int",
                 "dx",
                 "all",
                 "",
                 "zeros of shape with grad written at [start:end:step] along dim",
                 META({
                     CheckAttrs("slice_backward", a, 5, "shape, dim, start, end, step");
                     const Shape& shape = Attr<std::vector<int64_t>>("slice_backward", a, 0, "shape");
                     SliceSpec sp = NormalizeSlice(
                         "slice_backward", shape, Attr<int64_t>("slice_backward", a, 1, "dim"),
                         Attr<int64_t>("slice_backward", a, 2, "start"), Attr<int64_t>("slice_backward", a, 3, "end"),
                         Attr<int64_t>("slice_backward", a, 4, "step"));
                     Shape g = shape;
                     g[sp.dim] = sp.len;
                     if (g != in[0].shape()) {
                         OpError("slice_backward",
                                 "grad " + ShapeToString(in[0].shape()) + " must have shape " + ShapeToString(g));
                     }
                     return {{shape, in[0].dtype()}};
                 }),
                 1,
                 1,
                 {}});
    t.push_back({"concat",
                 R,
                 "xs...",
                 "dim:int",
                 "out",
                 "all",
                 "split",
                 "inputs joined along dim",
                 META({ return Concat("concat", in, a, false); }),
                 1,
                 -1,
                 {}});
    t.push_back({"stack",
                 R,
                 "xs...",
                 "dim:int",
                 "out",
                 "all",
                 "split",
                 "equal-shaped inputs joined along a new dim",
                 META({ return Concat("stack", in, a, true); }),
                 1,
                 -1,
                 {}});
    t.push_back({"split",
                 R,
                 "x",
                 "dim:int, sizes:ints",
                 "outs...",
                 "all",
                 "concat",
                 "x cut along dim into pieces of the given sizes (they must sum to x.shape[dim])",
                 META({
                     CheckAttrs("split", a, 2, "dim, sizes");
                     int64_t d = NormalizeDim("split", Attr<int64_t>("split", a, 0, "dim"), in[0].dim());
                     const auto& sizes = Attr<std::vector<int64_t>>("split", a, 1, "sizes");
                     int64_t total = 0;
                     Out out;
                     for (int64_t s : sizes) {
                         if (s < 0) OpError("split", "sizes must be >= 0");
                         total += s;
                         Shape sh = in[0].shape();
                         sh[d] = s;
                         out.push_back({sh, in[0].dtype()});
                     }
                     if (total != in[0].size(d)) {
                         OpError("split", "sizes sum to " + std::to_string(total) + " but dim " + std::to_string(d) +
                                              " has " + std::to_string(in[0].size(d)));
                     }
                     return out;
                 }),
                 1,
                 1,
                 {}});
    for (const char* name : {"tril", "triu"}) {
        t.push_back({name,
                     R,
                     "x",
                     "k:int",
                     "out",
                     kFloatTypes,
                     name,
                     std::string(name) == "tril" ? "x with elements above diagonal k of the last two dims zeroed"
                                                 : "x with elements below diagonal k of the last two dims zeroed",
                     META({
                         CheckAttrs("", a, 1, "k");
                         Attr<int64_t>("", a, 0, "k");
                         if (in[0].dim() < 2) OpError("", "x must be at least 2-d");
                         return UnaryFloat("", in);
                     }),
                     1,
                     1,
                     {}});
    }

    // ---- normalisation and softmax ----
    t.push_back({"softmax",
                 R,
                 "x",
                 "dim:int",
                 "out",
                 kFloatTypes,
                 "softmax_backward",
                 "exp(x) / sum exp(x) along dim",
                 META({ return Softmax("softmax", in, a, 0); }),
                 1,
                 1,
                 {}});
    t.push_back({"softmax_backward",
                 R,
                 "out, grad",
                 "dim:int",
                 "dx",
                 kFloatTypes,
                 "",
                 "out * (grad - sum(grad * out, dim))",
                 META({ return Softmax("softmax_backward", in, a, 1); }),
                 2,
                 2,
                 {}});
    t.push_back({"log_softmax",
                 R,
                 "x",
                 "dim:int",
                 "out",
                 kFloatTypes,
                 "log_softmax_backward",
                 "x - log sum exp(x) along dim",
                 META({ return Softmax("log_softmax", in, a, 0); }),
                 1,
                 1,
                 {}});
    t.push_back({"log_softmax_backward",
                 R,
                 "out, grad",
                 "dim:int",
                 "dx",
                 kFloatTypes,
                 "",
                 "grad - exp(out) * sum(grad, dim)",
                 META({ return Softmax("log_softmax_backward", in, a, 1); }),
                 2,
                 2,
                 {}});
    t.push_back(
        {"layernorm",
         R,
         "x, weight, bias",
         "eps:float",
         "out, mean, rstd",
         kFloatTypes,
         "layernorm_backward",
         "(x - mean) * rstd * weight + bias over the last dim; mean, rstd [...] in float32 (float64 for float64 x)",
         META({
             CheckAttrs("layernorm", a, 1, "eps");
             CheckFloat("layernorm", in[0], "x");
             if (in[0].dim() < 1) OpError("layernorm", "x must be at least 1-d");
             Shape c{in[0].size(-1)};
             for (int k = 1; k < 3; ++k) {
                 CheckSameDtype("layernorm", in[0], in[k]);
                 if (in[k].shape() != c) {
                     OpError("layernorm", "weight and bias must have shape " + ShapeToString(c) + ", got " +
                                              ShapeToString(in[k].shape()));
                 }
             }
             Shape rows(in[0].shape().begin(), in[0].shape().end() - 1);
             DataType st = StatType(in[0].dtype());
             return {{in[0].shape(), in[0].dtype()}, {rows, st}, {rows, st}};
         }),
         3,
         3,
         {}});
    t.push_back({"layernorm_backward",
                 R,
                 "grad, x, weight, mean, rstd",
                 "",
                 "dx, dweight, dbias",
                 kFloatTypes,
                 "",
                 "gradients of layernorm from the saved mean and rstd",
                 META({
                     CheckAttrs("layernorm_backward", a, 0, "");
                     CheckFloat("layernorm_backward", in[1], "x");
                     CheckSameShape("layernorm_backward", in[0], in[1], "grad and x");
                     CheckSameDtype("layernorm_backward", in[0], in[1]);
                     CheckSameDtype("layernorm_backward", in[1], in[2]);
                     if (in[1].dim() < 1) OpError("layernorm_backward", "x must be at least 1-d");
                     Shape c{in[1].size(-1)};
                     if (in[2].shape() != c)
                         OpError("layernorm_backward", "weight must have shape " + ShapeToString(c));
                     CheckStats("layernorm_backward", in[1], in[3], "mean");
                     CheckStats("layernorm_backward", in[1], in[4], "rstd");
                     return {{in[1].shape(), in[1].dtype()}, {c, in[1].dtype()}, {c, in[1].dtype()}};
                 }),
                 5,
                 5,
                 {}});
    t.push_back({"rmsnorm",
                 F,
                 "x, weight",
                 "eps:float",
                 "out, rstd",
                 kFloatTypes,
                 "rmsnorm_backward",
                 "x * rsqrt(mean(x^2) + eps) * weight over the last dim; rstd [...] in float32 (float64 for float64 x)",
                 META({
                     CheckAttrs("rmsnorm", a, 1, "eps");
                     CheckFloat("rmsnorm", in[0], "x");
                     CheckSameDtype("rmsnorm", in[0], in[1]);
                     if (in[0].dim() < 1 || in[1].shape() != Shape{in[0].size(-1)}) {
                         OpError("rmsnorm", "weight must have shape [" +
                                                std::to_string(in[0].dim() ? in[0].size(-1) : 0) + "], got " +
                                                ShapeToString(in[1].shape()));
                     }
                     Shape rows(in[0].shape().begin(), in[0].shape().end() - 1);
                     return {{in[0].shape(), in[0].dtype()}, {rows, StatType(in[0].dtype())}};
                 }),
                 2,
                 2,
                 {}});
    t.push_back({"rmsnorm_backward",
                 F,
                 "grad, x, weight, rstd",
                 "",
                 "dx, dweight",
                 kFloatTypes,
                 "",
                 "gradients of rmsnorm from the saved rstd",
                 META({
                     CheckAttrs("rmsnorm_backward", a, 0, "");
                     CheckFloat("rmsnorm_backward", in[1], "x");
                     CheckSameShape("rmsnorm_backward", in[0], in[1], "grad and x");
                     CheckSameDtype("rmsnorm_backward", in[0], in[1]);
                     CheckSameDtype("rmsnorm_backward", in[1], in[2]);
                     if (in[1].dim() < 1) OpError("rmsnorm_backward", "x must be at least 1-d");
                     Shape c{in[1].size(-1)};
                     if (in[2].shape() != c) OpError("rmsnorm_backward", "weight must have shape " + ShapeToString(c));
                     CheckStats("rmsnorm_backward", in[1], in[3], "rstd");
                     return {{in[1].shape(), in[1].dtype()}, {c, in[1].dtype()}};
                 }),
                 4,
                 4,
                 {}});

    // ---- fused transformer ops ----
    t.push_back({"swiglu",
                 F,
                 "gate, up",
                 "",
                 "out",
                 kFloatTypes,
                 "swiglu_backward",
                 "silu(gate) * up",
                 META({
                     CheckAttrs("swiglu", a, 0, "");
                     CheckFloat("swiglu", in[0], "gate");
                     CheckSameDtype("swiglu", in[0], in[1]);
                     CheckSameShape("swiglu", in[0], in[1], "gate and up");
                     return {{in[0].shape(), in[0].dtype()}};
                 }),
                 2,
                 2,
                 {}});
    t.push_back({"swiglu_backward",
                 F,
                 "gate, up, grad",
                 "",
                 "dgate, dup",
                 kFloatTypes,
                 "",
                 "gradients of silu(gate) * up",
                 META({
                     CheckAttrs("swiglu_backward", a, 0, "");
                     CheckFloat("swiglu_backward", in[0], "gate");
                     for (int k = 1; k < 3; ++k) {
                         CheckSameDtype("swiglu_backward", in[0], in[k]);
                         CheckSameShape("swiglu_backward", in[0], in[k], "gate, up and grad");
                     }
                     return {{in[0].shape(), in[0].dtype()}, {in[0].shape(), in[0].dtype()}};
                 }),
                 3,
                 3,
                 {}});
    t.push_back({"rope",
                 F,
                 "x, cos, sin",
                 "inverse:int",
                 "out",
                 kFloatTypes,
                 "rope (inverse=1)",
                 "rotates pairs (x[2i], x[2i+1]) of x [B, T, H, D] by angle[t, i] given cos, sin [T, D/2] "
                 "(float32, float64 for float64 x); inverse=1 rotates by -angle",
                 META({
                     CheckAttrs("rope", a, 1, "inverse");
                     Attr<int64_t>("rope", a, 0, "inverse");
                     CheckFloat("rope", in[0], "x");
                     CheckRank("rope", in[0], 4, "x");
                     int64_t T = in[0].size(1), D = in[0].size(3);
                     if (D % 2) OpError("rope", "head dim must be even, got " + std::to_string(D));
                     for (int k = 1; k < 3; ++k) {
                         CheckDtype("rope", in[k], StatType(in[0].dtype()), "cos/sin");
                         if (in[k].shape() != Shape{T, D / 2}) {
                             OpError("rope", "cos/sin must have shape [" + std::to_string(T) + ", " +
                                                 std::to_string(D / 2) + "], got " + ShapeToString(in[k].shape()));
                         }
                     }
                     return {{in[0].shape(), in[0].dtype()}};
                 }),
                 3,
                 3,
                 {}});
    t.push_back({"sdpa",
                 F,
                 "q, k, v",
                 "causal:int, scale:float",
                 "out, lse",
                 kFloatTypes,
                 "sdpa_backward",
                 "softmax(q k^T * scale [+ causal mask]) v; q [B, Hq, T, D], k, v [B, Hkv, S, D], Hq % Hkv == 0 "
                 "(grouped-query heads); lse [B, Hq, T] in float32 (float64 for float64 inputs)",
                 META({ return SdpaMeta("sdpa", in, a); }),
                 3,
                 3,
                 {}});
    t.push_back(
        {"sdpa_backward",
         F,
         "grad, q, k, v, out, lse",
         "causal:int, scale:float",
         "dq, dk, dv",
         kFloatTypes,
         "",
         "gradients of sdpa from its saved out and lse",
         META({
             Out fwd = SdpaMeta("sdpa_backward", {in[1], in[2], in[3]}, a);
             CheckSameShape("sdpa_backward", in[0], in[1], "grad and q");
             CheckSameShape("sdpa_backward", in[4], in[1], "out and q");
             CheckSameDtype("sdpa_backward", in[0], in[1]);
             CheckSameDtype("sdpa_backward", in[4], in[1]);
             if (in[5].shape() != fwd[1].shape) {
                 OpError("sdpa_backward", "lse must have shape " + ShapeToString(fwd[1].shape));
             }
             CheckDtype("sdpa_backward", in[5], fwd[1].dtype, "lse");
             return {{in[1].shape(), in[1].dtype()}, {in[2].shape(), in[2].dtype()}, {in[3].shape(), in[3].dtype()}};
         }),
         6,
         6,
         {}});
    t.push_back({"cross_entropy",
                 F,
                 "logits, target",
                 "ignore_index:int",
                 "loss, lse",
                 kFloatTypes,
                 "cross_entropy_backward",
                 "mean over rows with target != ignore_index of lse(logits) - logits[target]; logits [N, V], target "
                 "int64 [N]; loss 0-d and lse [N] in float32 (float64 for float64 logits)",
                 META({ return CrossEntropyMeta("cross_entropy", in, a); }),
                 2,
                 2,
                 {}});
    t.push_back({"cross_entropy_backward",
                 F,
                 "logits, target, lse, grad",
                 "ignore_index:int",
                 "dlogits",
                 kFloatTypes,
                 "",
                 "grad * (softmax(logits) - onehot(target)) / count, zero on ignored rows",
                 META({
                     Out fwd = CrossEntropyMeta("cross_entropy_backward", {in[0], in[1]}, a);
                     for (int k = 2; k < 4; ++k) {
                         const TensorMeta& want = fwd[k == 2 ? 1 : 0];
                         const char* what = k == 2 ? "lse" : "grad";
                         CheckDtype("cross_entropy_backward", in[k], want.dtype, what);
                         if (in[k].shape() != want.shape) {
                             OpError("cross_entropy_backward",
                                     std::string(what) + " must have shape " + ShapeToString(want.shape));
                         }
                     }
                     return {{in[0].shape(), in[0].dtype()}};
                 }),
                 4,
                 4,
                 {}});

    // ---- optimizer ----
    t.push_back({"adamw_",
                 F,
                 "param, grad, m, v",
                 "lr:float, beta1:float, beta2:float, eps:float, weight_decay:float, step:int",
                 "",
                 kFloatTypes,
                 "",
                 "decoupled-weight-decay Adam step in place; m and v are float32 (float64 for float64 params)",
                 META({
                     CheckAttrs("adamw_", a, 6, "lr, beta1, beta2, eps, weight_decay, step");
                     CheckFloat("adamw_", in[0], "param");
                     CheckSameDtype("adamw_", in[0], in[1]);
                     for (int k = 1; k < 4; ++k) CheckSameShape("adamw_", in[0], in[k], "param, grad, m and v");
                     CheckDtype("adamw_", in[2], StatType(in[0].dtype()), "m");
                     CheckDtype("adamw_", in[3], StatType(in[0].dtype()), "v");
                     if (Attr<int64_t>("adamw_", a, 5, "step") < 1) OpError("adamw_", "step must be >= 1");
                     return {};
                 }),
                 4,
                 4,
                 {0, 2, 3}});
    return t;
}

}  // namespace

std::vector<OpSchema> BuildOpSchemas() { return Schemas(); }

}  // namespace infinitrain
