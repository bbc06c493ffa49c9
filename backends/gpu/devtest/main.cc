// Throwaway harness: runs every op on the GPU and compares with the CPU kernels, either against a float64 CPU
// reference with the test suites' tolerances (ref64) or exactly against the same-dtype CPU result.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "infinitrain/op.h"
#include "infinitrain/provider.h"
#include "infinitrain/runtime.h"
#include "infinitrain/tensor.h"

namespace infinitrain::gpu {
void RaisePendingDeviceError(int device);
}

using namespace infinitrain;
using DT = DataType;

namespace {

const Device kCpu{};
const Device kGpu{DeviceType::kPrivateUse1, 0};
std::mt19937_64 g_rng(12345);
int g_fail = 0, g_cases = 0;
bool g_verbose = false;
std::string g_filter;

const DT kFloats[] = {DT::kFloat32, DT::kBFloat16, DT::kFloat16, DT::kFloat64};

DT Stat(DT t) { return t == DT::kFloat64 ? DT::kFloat64 : DT::kFloat32; }

Tensor Cast(const Tensor& t, DT dt) {
    if (t.dtype() == dt) return t.To(t.device());
    return GetOp("cast").Call({t}, {std::string(DataTypeName(dt))})[0];
}

Tensor FromVals(const Shape& s, const std::vector<double>& v, DT dt) {
    Tensor f = Tensor::Empty(s, DT::kFloat64, kCpu);
    std::memcpy(f.data(), v.data(), v.size() * 8);
    return Cast(f, dt);
}

std::vector<double> Vals(const Tensor& t) {
    Tensor c = t.device().is_cpu() ? t : t.To(kCpu);
    Tensor d = Cast(c, DT::kFloat64);
    std::vector<double> v(d.numel());
    if (!v.empty()) std::memcpy(v.data(), d.data(), v.size() * 8);
    return v;
}

Tensor RandN(const Shape& s, DT dt, double scale = 1, double shift = 0) {
    std::normal_distribution<double> nd;
    std::vector<double> v(Numel(s));
    for (double& x : v) x = nd(g_rng) * scale + shift;
    return FromVals(s, v, dt);
}

Tensor RandU(const Shape& s, DT dt, double lo, double hi) {
    std::uniform_real_distribution<double> ud(lo, hi);
    std::vector<double> v(Numel(s));
    for (double& x : v) x = ud(g_rng);
    return FromVals(s, v, dt);
}

Tensor RandInt(const Shape& s, int64_t lo, int64_t hi, DT dt = DT::kInt64) {
    std::uniform_int_distribution<int64_t> ud(lo, hi - 1);
    std::vector<double> v(Numel(s));
    for (double& x : v) x = static_cast<double>(ud(g_rng));
    return FromVals(s, v, dt);
}

Tensor Ints(const Shape& s, const std::vector<double>& v) { return FromVals(s, v, DT::kInt64); }

struct Tol {
    double rtol, atol;
};
Tol TolFor(DT t) {
    switch (t) {
        case DT::kFloat32:
            return {1.3e-6, 1e-5};
        case DT::kBFloat16:
            return {1.6e-2, 1e-5};
        case DT::kFloat16:
            return {1e-3, 1e-5};
        case DT::kFloat64:
            return {1e-10, 1e-12};
        default:
            return {0, 0};
    }
}

enum Mode { kRef64, kExact };

// Compares got (GPU) with ref (CPU) elementwise; returns the worst error ratio (inf on a NaN/shape mismatch).
double Compare(const Tensor& got, const Tensor& ref, Tol tol, bool exact, std::string* why) {
    if (got.shape() != ref.shape()) {
        *why = "shape " + ShapeToString(got.shape()) + " vs " + ShapeToString(ref.shape());
        return INFINITY;
    }
    std::vector<double> g = Vals(got), r = Vals(ref);
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        double a = g[i], b = r[i];
        if (std::isnan(a) || std::isnan(b)) {
            if (std::isnan(a) != std::isnan(b)) {
                *why = "NaN mismatch at " + std::to_string(i) + ": got " + std::to_string(a) + " want " +
                       std::to_string(b);
                return INFINITY;
            }
            continue;
        }
        if (a == b) continue;
        if (exact || std::isinf(a) || std::isinf(b)) {
            *why = "at " + std::to_string(i) + ": got " + std::to_string(a) + " want " + std::to_string(b);
            return INFINITY;
        }
        double ratio = std::fabs(a - b) / (tol.atol + tol.rtol * std::fabs(b));
        if (ratio > worst) {
            worst = ratio;
            if (ratio > 1) {
                char buf[200];
                snprintf(buf, sizeof buf, "at %zu: got %.9g want %.9g", i, a, b);
                *why = buf;
            }
        }
    }
    return worst;
}

// Runs op on the GPU and on the CPU (float64 copies for kRef64) and compares outputs and in-place inputs.
void Check(const std::string& name, const std::string& opname, const std::vector<Tensor>& in, const Attrs& attrs,
           Mode mode, double tol_scale = 1.0, std::vector<int> skip_outputs = {}) {
    if (!g_filter.empty() && name.find(g_filter) == std::string::npos) return;
    ++g_cases;
    const Op& op = GetOp(opname);
    std::vector<Tensor> gin, rin;
    for (const Tensor& t : in) {
        gin.push_back(t.To(kGpu));
        rin.push_back(mode == kRef64 && IsFloating(t.dtype()) ? Cast(t, DT::kFloat64) : t.To(kCpu));
    }
    std::vector<Tensor> gout, rout;
    try {
        gout = op.Call(gin, attrs);
        GetRuntime(DeviceType::kPrivateUse1).SynchronizeDevice(0);
    } catch (const std::exception& e) {
        ++g_fail;
        printf("FAIL %-60s gpu raised: %s\n", name.c_str(), e.what());
        return;
    }
    rout = op.Call(rin, attrs);
    std::vector<std::pair<Tensor, Tensor>> pairs;
    for (size_t k = 0; k < gout.size(); ++k) {
        if (std::find(skip_outputs.begin(), skip_outputs.end(), static_cast<int>(k)) == skip_outputs.end()) {
            pairs.push_back({gout[k], rout[k]});
        }
    }
    for (int k : op.schema().inplace) pairs.push_back({gin[k], rin[k]});
    double worst = 0;
    std::string why;
    for (auto& [g, r] : pairs) {
        Tol tol = TolFor(g.dtype());
        tol.rtol *= tol_scale;
        tol.atol *= tol_scale;
        const bool exact = mode == kExact || !IsFloating(g.dtype());
        std::string w;
        double v = Compare(g, r, tol, exact, &w);
        if (v > worst) {
            worst = v;
            why = w;
        }
    }
    if (worst > 1) {
        ++g_fail;
        printf("FAIL %-60s ratio %.3g %s\n", name.c_str(), worst, why.c_str());
    } else if (g_verbose) {
        printf("ok   %-60s ratio %.3g\n", name.c_str(), worst);
    }
}

// Expects the GPU op to record an index error whose message equals the CPU's.
void CheckIndexError(const std::string& name, const std::string& opname, const std::vector<Tensor>& in,
                     const Attrs& attrs) {
    if (!g_filter.empty() && name.find(g_filter) == std::string::npos) return;
    ++g_cases;
    std::string want = "(no error)", got = "(no error)";
    try {
        GetOp(opname).Call(in, attrs);
    } catch (const std::out_of_range& e) {
        want = e.what();
    }
    std::vector<Tensor> gin;
    for (const Tensor& t : in) gin.push_back(t.To(kGpu));
    try {
        GetOp(opname).Call(gin, attrs);
        GetRuntime(DeviceType::kPrivateUse1).SynchronizeDevice(0);
    } catch (const std::out_of_range& e) {
        got = e.what();
    } catch (const std::exception& e) {
        got = std::string("other exception: ") + e.what();
    }
    if (got != want) {
        ++g_fail;
        printf("FAIL %-60s got '%s' want '%s'\n", name.c_str(), got.c_str(), want.c_str());
    } else if (g_verbose) {
        printf("ok   %-60s %s\n", name.c_str(), got.c_str());
    }
}

std::string S(const Shape& s) { return ShapeToString(s); }
std::string N(DT t) { return DataTypeName(t); }
Attrs A(std::initializer_list<AttrValue> a) { return Attrs(a); }

// ---- test groups ----------------------------------------------------------------------------

void TestCopy() {
    const DT all[] = {DT::kBool,    DT::kUInt8,    DT::kInt8,    DT::kInt32,  DT::kInt64,
                      DT::kFloat16, DT::kBFloat16, DT::kFloat32, DT::kFloat64};
    for (DT src : all) {
        for (DT dst : all) {
            for (Shape s : {Shape{0}, Shape{1}, Shape{3, 17}, Shape{2, 3, 33}, Shape{4099}}) {
                Tensor x;
                if (src == DT::kBool) {
                    x = RandInt(s, 0, 2, DT::kBool);
                } else if (dst == DT::kUInt8 || src == DT::kUInt8) {
                    x = RandInt(s, 0, 128, src);
                } else if (dst == DT::kInt8 || src == DT::kInt8) {
                    x = RandInt(s, -128, 128, src);
                } else if (!IsFloating(src)) {
                    x = RandInt(s, -1000, 1000, src);
                } else {
                    x = RandN(s, src, 10);
                }
                Check("cast " + N(src) + "->" + N(dst) + S(s), "cast", {x}, A({std::string(N(dst))}), kExact);
            }
        }
        Check("copy_ f64->" + N(src), "copy_", {RandInt({5, 7}, 0, 2, src), RandN({5, 7}, DT::kFloat64)}, {}, kExact);
        Check("fill_ " + N(src), "fill_", {RandInt({4, 9}, 0, 2, src)}, A({src == DT::kBool ? 1.0 : 7.0}), kExact);
        Check("fill_ -0.3 " + N(src), "fill_", {RandInt({4, 9}, 0, 2, src)}, A({-0.3}), kExact);
        Check("fill_ 0 " + N(src), "fill_", {RandInt({4, 9}, 1, 2, src)}, A({0.0}), kExact);
    }
    // float64 -> float16 rounds once.
    std::vector<double> edges = {65519.99999,
                                 65520.0,
                                 -65520.0,
                                 65504.0,
                                 1 + std::ldexp(1, -11) + std::ldexp(1, -40),
                                 std::ldexp(1, -25),
                                 std::ldexp(1.5, -24),
                                 6.1e-5,
                                 -0.0,
                                 INFINITY,
                                 -INFINITY};
    std::uniform_real_distribution<double> ue(-8, 5);
    std::normal_distribution<double> nd;
    for (int i = 0; i < 20000; ++i) edges.push_back(nd(g_rng) * std::pow(10.0, ue(g_rng)));
    Check("cast f64->f16 edges", "cast", {FromVals({(int64_t)edges.size()}, edges, DT::kFloat64)},
          A({std::string("float16")}), kExact);
    Check("cast f64->bf16 edges", "cast", {FromVals({(int64_t)edges.size()}, edges, DT::kFloat64)},
          A({std::string("bfloat16")}), kExact);
}

void TestRandom() {
    for (DT t : kFloats) {
        for (int64_t n : {0L, 1L, 5003L, 400003L}) {
            Shape s{n};
            int64_t seed = 123456789012345LL, off = 987654321LL;
            Check("uniform_ " + N(t) + S(s), "uniform_", {RandN(s, t)}, A({-2.0, 3.0, seed, off}), kExact);
            // normal_ uses double log/cos (may differ from libm in the last bit): against the float64 draw.
            Check("normal_ " + N(t) + S(s), "normal_", {RandN(s, t)}, A({0.25, 1.5, seed, off}), kRef64);
            Check("dropout " + N(t) + S(s), "dropout", {RandN(s, t)}, A({0.3, seed, off}), kExact);
            Check("dropout_backward " + N(t) + S(s), "dropout_backward", {RandN(s, t), RandInt(s, 0, 2, DT::kBool)},
                  A({0.3}), kExact);
        }
        Check("uniform_ wrap " + N(t), "uniform_", {RandN({64}, t)},
              A({0.0, 1.0, int64_t{7}, std::numeric_limits<int64_t>::max() - 10}), kExact);
    }
}

void TestElementwise() {
    const char* unary[] = {"neg", "exp",  "log",     "sqrt", "rsqrt", "abs",      "sin",
                           "cos", "tanh", "sigmoid", "relu", "silu",  "gelu_tanh"};
    const Shape shapes[] = {Shape{}, Shape{1}, Shape{3}, Shape{17, 33}, Shape{2, 1, 65}, Shape{0, 3}, Shape{40001}};
    for (DT t : kFloats) {
        for (const char* op : unary) {
            bool pos = !strcmp(op, "log") || !strcmp(op, "sqrt") || !strcmp(op, "rsqrt");
            for (const Shape& s : shapes) {
                Tensor x = pos ? RandU(s, t, 0.05, 8.0) : RandN(s, t, 2.0);
                Check(std::string(op) + " " + N(t) + S(s), op, {x}, {}, kRef64);
            }
            // tails
            std::vector<double> tails = {-100, -30, -10, -1e-3, 0, 1e-3, 10, 30, 100, NAN};
            if (pos) tails = {1e-30, 1e-5, 1, 1e5, 1e30, NAN};
            Check(std::string(op) + " tails " + N(t), op, {FromVals({(int64_t)tails.size()}, tails, t)}, {}, kRef64);
        }
        for (const Shape& s : shapes) {
            Check("affine " + N(t) + S(s), "affine", {RandN(s, t)}, A({1.7, -0.3}), kRef64);
            Check("clamp " + N(t) + S(s), "clamp", {RandN(s, t, 2)}, A({-0.5, 0.7}), kRef64);
            for (double e : {2.0, 0.5, -1.5, 3.0}) {
                Check("pow_scalar " + std::to_string(e) + " " + N(t) + S(s), "pow_scalar", {RandU(s, t, 0.1, 3)},
                      A({e}), kRef64);
            }
            for (const char* op :
                 {"tanh_backward", "sigmoid_backward", "relu_backward", "silu_backward", "gelu_tanh_backward"}) {
                Tensor x = RandN(s, t, 2);
                if (!strcmp(op, "tanh_backward") || !strcmp(op, "sigmoid_backward")) x = RandU(s, t, -0.99, 0.99);
                Check(std::string(op) + " " + N(t) + S(s), op, {x, RandN(s, t)}, {}, kRef64);
            }
            Check("swiglu " + N(t) + S(s), "swiglu", {RandN(s, t, 2), RandN(s, t)}, {}, kRef64);
            Check("swiglu_backward " + N(t) + S(s), "swiglu_backward", {RandN(s, t, 2), RandN(s, t), RandN(s, t)}, {},
                  kRef64);
            Tensor y = RandN(s, t);
            Check("axpy_ " + N(t) + S(s), "axpy_", {y, RandN(s, t)}, A({0.37}), kRef64);
        }
        const std::pair<Shape, Shape> bcast[] = {{{3, 4}, {3, 4}},
                                                 {{2, 3, 4}, {4}},
                                                 {{4}, {2, 3, 4}},
                                                 {{2, 1, 4}, {3, 1}},
                                                 {{1}, {5}},
                                                 {{}, {3}},
                                                 {{}, {}},
                                                 {{17, 1, 33}, {1, 65, 1}},
                                                 {{5, 1, 3, 1}, {1, 7, 1, 2}},
                                                 {{0, 3}, {1, 3}},
                                                 {{2, 0, 3}, {3}},
                                                 {{20001}, {}},
                                                 {{301, 200}, {301, 1}},
                                                 {{6, 1, 64, 70}, {1, 9, 64, 1}},
                                                 {{4096, 3}, {4096, 3}}};
        for (auto& [sa, sb] : bcast) {
            for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum"}) {
                Tensor b = !strcmp(op, "div") ? RandU(sb, t, 0.5, 2.0) : RandN(sb, t);
                Check(std::string(op) + " " + N(t) + S(sa) + S(sb), op, {RandN(sa, t), b}, {}, kRef64);
            }
            for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
                Tensor a = RandInt(sa, -2, 3, t), b = RandInt(sb, -2, 3, t);
                Check(std::string(op) + " " + N(t) + S(sa) + S(sb), op, {a, b}, {}, kExact);
            }
            Check("where " + N(t) + S(sa) + S(sb), "where", {RandInt(sb, 0, 2, DT::kBool), RandN(sa, t), RandN({1}, t)},
                  {}, kExact);
            Check("where2 " + N(t) + S(sa) + S(sb), "where", {RandInt(sa, 0, 2, DT::kBool), RandN(sb, t), RandN(sa, t)},
                  {}, kExact);
        }
        std::vector<double> na = {NAN, 1.0, NAN, -2.0, 3.0}, nb = {0.0, NAN, NAN, 5.0, -1.0};
        for (const char* op : {"maximum", "minimum"}) {
            Check(std::string(op) + " nan " + N(t), op, {FromVals({5}, na, t), FromVals({5}, nb, t)}, {}, kRef64);
        }
        for (Shape ms : {Shape{3, 4}, Shape{4}, Shape{3, 1}, Shape{1}}) {
            for (double v : {-3.5, -1e4, -static_cast<double>(INFINITY)}) {
                Check("masked_fill " + N(t) + S(ms) + std::to_string(v), "masked_fill",
                      {RandN({3, 4}, t), RandInt(ms, 0, 2, DT::kBool)}, A({v}), kExact);
            }
        }
    }
    for (DT t : {DT::kInt32, DT::kInt64}) {
        for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
            Check(std::string(op) + " " + N(t), op, {RandInt({7, 33}, -5, 5, t), RandInt({33}, -5, 5, t)}, {}, kExact);
        }
    }
    std::vector<double> big = {9007199254740993.0, 9007199254740992.0};  // int64 compare is exact
    Check("eq int64 exact", "eq", {Ints({1}, {std::ldexp(1, 53)}), Ints({1}, {std::ldexp(1, 53) + 2})}, {}, kExact);
}

void TestReduce() {
    const std::pair<Shape, std::vector<int64_t>> cases[] = {{{17}, {}},
                                                            {{17}, {0}},
                                                            {{3, 17}, {1}},
                                                            {{3, 17}, {0}},
                                                            {{3, 17}, {-1}},
                                                            {{3, 17}, {0, 1}},
                                                            {{2, 3, 33}, {0, 2}},
                                                            {{2, 3, 33}, {-1, 0}},
                                                            {{2, 3, 33}, {1}},
                                                            {{2, 3, 5, 7}, {1, 3}},
                                                            {{2, 3, 5, 7}, {0, 2, 3}},
                                                            {{2, 3, 5, 7}, {3, 1, 0}},
                                                            {{4, 1, 5}, {1}},
                                                            {{4, 1, 5}, {0, 1}},
                                                            {{1, 65, 1}, {0, 2}},
                                                            {{65, 33}, {}},
                                                            {{}, {}},
                                                            {{1, 1}, {}},
                                                            {{300, 257}, {0}},
                                                            {{40000}, {}},
                                                            {{20000, 3}, {0}},
                                                            {{3, 40001, 2}, {1}},
                                                            {{3, 40001, 2}, {}},
                                                            {{3, 40001, 2}, {0, 1}},
                                                            {{8, 100000}, {1}},
                                                            {{1000000}, {}},
                                                            {{64, 5000}, {1}},
                                                            {{3, 0, 4}, {1}},
                                                            {{3, 0, 4}, {0, 1}},
                                                            {{0}, {}},
                                                            {{3, 0, 4}, {0}}};
    for (DT t : kFloats) {
        for (auto& [s, dims] : cases) {
            std::string ds = "[";
            for (int64_t d : dims) ds += std::to_string(d) + ",";
            ds += "]";
            for (int keep : {0, 1}) {
                for (const char* op : {"sum", "mean", "amax"}) {
                    if (!strcmp(op, "amax") && Numel(s) == 0) continue;
                    Tensor x = Numel(s) > 1000 ? RandU(s, t, 0.5, 1.5) : RandN(s, t);
                    Check(std::string(op) + " " + N(t) + S(s) + ds + " k" + std::to_string(keep), op, {x},
                          A({dims, int64_t{keep}}), kRef64);
                }
            }
        }
        std::vector<double> v(60);
        for (auto& x : v) x = std::normal_distribution<double>()(g_rng);
        v[1 * 20 + 2 * 5 + 3] = NAN;
        for (auto dims : {std::vector<int64_t>{}, std::vector<int64_t>{1}, std::vector<int64_t>{0, 2}}) {
            Check("amax nan " + N(t), "amax", {FromVals({3, 4, 5}, v, t)}, A({dims, int64_t{0}}), kRef64);
        }
        const std::pair<Shape, int64_t> am[] = {{{17}, 0},      {{3, 17}, 1},   {{3, 17}, 0},   {{2, 3, 33}, 1},
                                                {{5, 5000}, 1}, {{5000, 3}, 0}, {{7, 1, 2}, 1}, {{64, 300}, -1}};
        for (auto& [s, d] : am) {
            for (int keep : {0, 1}) {
                Check("argmax " + N(t) + S(s) + std::to_string(d), "argmax", {RandInt(s, -20, 20, t)},
                      A({d, int64_t{keep}}), kExact);
            }
        }
        std::vector<double> an(4 * 9);
        for (auto& x : an) x = std::normal_distribution<double>()(g_rng);
        an[1 * 9 + 4] = NAN;
        an[1 * 9 + 5] = NAN;
        an[2 * 9 + 0] = NAN;
        Check("argmax nan " + N(t), "argmax", {FromVals({4, 9}, an, t)}, A({int64_t{1}, int64_t{0}}), kExact);
        Check("argmax nan col " + N(t), "argmax", {FromVals({4, 9}, an, t)}, A({int64_t{0}, int64_t{0}}), kExact);
        for (Shape s : {Shape{}, Shape{0}, Shape{17}, Shape{3, 40001}, Shape{5000000}}) {
            Check("sum_squares " + N(t) + S(s), "sum_squares", {RandN(s, t)}, {}, kRef64);
        }
    }
}

void TestGemm() {
    const std::pair<Shape, Shape> mm[] = {
        {{1, 1}, {1, 1}},          {{3, 17}, {17, 33}},        {{7, 65}, {65, 1}},
        {{2, 3, 5, 7}, {7, 4}},    {{5, 7}, {2, 3, 7, 4}},     {{2, 1, 5, 9}, {1, 3, 9, 6}},
        {{4, 1, 3, 5}, {6, 5, 2}}, {{64, 9, 17}, {64, 17, 9}}, {{2, 200, 65}, {2, 65, 300}},
        {{3, 33, 128}, {128, 17}}, {{3, 0}, {0, 4}},           {{0, 3, 4}, {4, 5}},
        {{0, 4}, {4, 5}},          {{2, 3, 4}, {2, 4, 0}},     {{256, 512}, {512, 384}}};
    for (DT t : kFloats) {
        for (auto& [la, lb] : mm) {
            for (int ta : {0, 1}) {
                for (int tb : {0, 1}) {
                    Shape sa = la, sb = lb;
                    if (ta) std::swap(sa[sa.size() - 1], sa[sa.size() - 2]);
                    if (tb) std::swap(sb[sb.size() - 1], sb[sb.size() - 2]);
                    int64_t k = la.back();
                    double scale = (t == DT::kFloat32 && k > 64) ? k / 64.0 : 1.0;
                    Check("matmul " + N(t) + S(la) + S(lb) + std::to_string(ta) + std::to_string(tb), "matmul",
                          {RandN(sa, t), RandN(sb, t)}, A({int64_t{ta}, int64_t{tb}}), kRef64, scale);
                }
            }
        }
        const std::pair<Shape, int64_t> lin[] = {{{17}, 5},         {{1, 1}, 1}, {{5, 17}, 33}, {{2, 3, 65}, 7},
                                                 {{4, 9, 128}, 65}, {{3, 0}, 4}, {{0, 5}, 4},   {{64, 768}, 2304}};
        for (auto& [xs, of] : lin) {
            for (bool bias : {false, true}) {
                std::vector<Tensor> in = {RandN(xs, t), RandN({of, xs.back()}, t)};
                if (bias) in.push_back(RandN({of}, t));
                double scale = (t == DT::kFloat32 && xs.back() > 64) ? xs.back() / 64.0 : 1.0;
                Check("linear " + N(t) + S(xs) + std::to_string(of) + (bias ? " bias" : ""), "linear", in, {}, kRef64,
                      scale);
            }
        }
    }
}

void TestIndex() {
    for (DT t : kFloats) {
        for (auto [V, C, idx] : {std::tuple<int64_t, int64_t, Shape>{10, 4, {3, 5}},
                                 {257, 64, {8, 64}},
                                 {50, 7, {100}},
                                 {5, 3, {0}},
                                 {6, 0, {4}},
                                 {1000, 768, {4, 1024}}}) {
            Tensor ind = RandInt(idx, 0, V);
            Check("embedding " + N(t) + std::to_string(V) + "x" + std::to_string(C) + S(idx), "embedding",
                  {RandN({V, C}, t), ind}, {}, kExact);
            Shape gs = idx;
            gs.push_back(C);
            Check("embedding_backward " + N(t) + std::to_string(V) + "x" + std::to_string(C) + S(idx),
                  "embedding_backward", {RandN(gs, t), ind}, A({V}), kRef64);
        }
        // many repeats into one row, and a long sort
        Check("embedding_backward repeats " + N(t), "embedding_backward",
              {RandU({30000, 5}, t, 0.5, 1.5), RandInt({30000}, 0, 1)}, A({int64_t{2}}), kRef64);
        Check("embedding_backward sort " + N(t), "embedding_backward", {RandN({70000, 3}, t), RandInt({70000}, 0, 777)},
              A({int64_t{777}}), kRef64);
        Check("embedding_backward zero-C " + N(t), "embedding_backward", {RandN({5, 0}, t), RandInt({5}, 0, 3)},
              A({int64_t{3}}), kRef64);
        const std::tuple<Shape, int64_t, int64_t> gc[] = {{{5}, 0, 7},         {{3, 4}, 0, 2},      {{3, 4}, 1, 6},
                                                          {{3, 4}, -1, 1},     {{2, 3, 4}, 1, 5},   {{2, 3, 4}, -3, 3},
                                                          {{2, 1, 17}, 1, 4},  {{2, 33, 3}, 1, 0},  {{1, 1}, 0, 1},
                                                          {{64, 300}, 1, 257}, {{1000, 70}, 0, 900}};
        for (auto& [xs, dim, m] : gc) {
            Shape is = xs;
            int64_t d = dim < 0 ? dim + (int64_t)xs.size() : dim;
            is[d] = m;
            Tensor ind = RandInt(is, 0, xs[d]);
            Check("gather " + N(t) + S(xs) + std::to_string(dim), "gather", {RandN(xs, t), ind}, A({dim}), kExact);
            Check("scatter_add " + N(t) + S(xs) + std::to_string(dim), "scatter_add", {RandN(xs, t), ind, RandN(is, t)},
                  A({dim}), kRef64);
        }
        Check("scatter_add accum " + N(t), "scatter_add",
              {RandN({3, 2}, t), Ints({20000, 2}, std::vector<double>(40000, 1.0)), RandU({20000, 2}, t, 0.5, 1.5)},
              A({int64_t{0}}), kRef64);
    }
    Tensor w = RandN({6, 4}, DT::kFloat32);
    CheckIndexError("embedding bad 6", "embedding", {w, Ints({3}, {0, 6, 1})}, {});
    CheckIndexError("embedding bad -1", "embedding", {w, Ints({1, 1}, {-1})}, {});
    CheckIndexError("embedding bad zero-C", "embedding", {RandN({6, 0}, DT::kFloat32), Ints({2}, {0, 9})}, {});
    CheckIndexError("embedding_backward bad", "embedding_backward", {RandN({3, 4}, DT::kFloat32), Ints({3}, {0, 5, 1})},
                    A({int64_t{5}}));
    Tensor x = RandN({3, 4}, DT::kFloat32);
    CheckIndexError("gather bad 4", "gather", {x, Ints({3, 1}, {0, 4, 1})}, A({int64_t{1}}));
    CheckIndexError("gather bad -1", "gather", {x, Ints({1, 4}, {0, 1, -1, 2})}, A({int64_t{0}}));
    CheckIndexError("scatter_add bad 7", "scatter_add", {x, Ints({3, 1}, {0, 7, 1}), RandN({3, 1}, DT::kFloat32)},
                    A({int64_t{1}}));
    CheckIndexError("scatter_add bad -2", "scatter_add", {x, Ints({3, 1}, {0, -2, 1}), RandN({3, 1}, DT::kFloat32)},
                    A({int64_t{-1}}));
    for (double bad : {5.0, 7.0, -1.0, -101.0}) {
        Tensor lg = RandN({3, 5}, DT::kFloat32), tg = Ints({3}, {0, bad, 4});
        CheckIndexError("cross_entropy bad " + std::to_string(bad), "cross_entropy", {lg, tg}, A({int64_t{-100}}));
        CheckIndexError("cross_entropy_backward bad " + std::to_string(bad), "cross_entropy_backward",
                        {lg, tg, RandN({3}, DT::kFloat32), FromVals({}, {1.0}, DT::kFloat32)}, A({int64_t{-100}}));
    }
}

void TestShape() {
    const DT types[] = {DT::kFloat32, DT::kBFloat16, DT::kFloat64, DT::kInt64, DT::kBool, DT::kUInt8, DT::kInt32};
    for (DT t : types) {
        auto R = [&](const Shape& s) { return IsFloating(t) ? RandN(s, t) : RandInt(s, 0, 2, t); };
        const std::pair<Shape, std::vector<int64_t>> pm[] = {{{2, 3}, {1, 0}},
                                                             {{2, 3, 4}, {0, 2, 1}},
                                                             {{2, 3, 4}, {2, 0, 1}},
                                                             {{2, 3, 4, 5}, {0, 2, 1, 3}},
                                                             {{1, 3, 1, 5}, {3, 2, 1, 0}},
                                                             {{4, 0, 3}, {2, 1, 0}},
                                                             {{}, {}},
                                                             {{7}, {0}},
                                                             {{8, 64, 12, 64}, {0, 2, 1, 3}},
                                                             {{33, 65}, {1, 0}}};
        for (auto& [s, d] : pm) Check("permute " + N(t) + S(s), "permute", {R(s)}, A({d}), kExact);
        const std::tuple<Shape, int64_t, int64_t, int64_t, int64_t> sl[] = {
            {{10}, 0, 2, 8, 1},      {{10}, 0, -3, 100, 1},         {{10}, 0, 1, 9, 3},      {{4, 6}, 1, 1, 5, 2},
            {{4, 6}, 0, 0, 4, 1},    {{4, 6}, -2, -100, 2, 1},      {{2, 5, 3}, 1, 3, 1, 1}, {{2, 5, 3}, 2, 0, 3, 2},
            {{3, 7, 8}, 1, 1, 6, 1}, {{64, 1024, 12}, 1, 0, 512, 1}};
        for (auto& [s, dim, st, en, stp] : sl) {
            std::string nm = N(t) + S(s) + std::to_string(dim) + ":" + std::to_string(st) + ":" + std::to_string(en) +
                             ":" + std::to_string(stp);
            Check("slice " + nm, "slice", {R(s)}, A({dim, st, en, stp}), kExact);
            Tensor y = GetOp("slice").Call({R(s)}, A({dim, st, en, stp}))[0];
            Check("slice_backward " + nm, "slice_backward", {R(y.shape())}, A({s, dim, st, en, stp}), kExact);
        }
        const std::pair<std::vector<Shape>, int64_t> cc[] = {{{{2, 3}, {2, 5}}, 1},
                                                             {{{2, 3}, {4, 3}}, 0},
                                                             {{{1, 2, 3}, {1, 0, 3}, {1, 4, 3}}, -2},
                                                             {{{5}}, 0},
                                                             {{{2, 2, 2}, {2, 2, 2}, {2, 2, 2}}, 2},
                                                             {{{3, 1}, {3, 7}}, 1}};
        for (auto& [shapes, d] : cc) {
            std::vector<Tensor> in;
            std::string nm;
            for (auto& s : shapes) {
                in.push_back(R(s));
                nm += S(s);
            }
            Check("concat " + N(t) + nm, "concat", in, A({d}), kExact);
        }
        for (auto [s, n, d] :
             {std::tuple<Shape, int, int64_t>{{2, 3}, 3, 0}, {{2, 3}, 2, 2}, {{4}, 5, -1}, {{2, 0}, 2, 1}}) {
            std::vector<Tensor> in;
            for (int i = 0; i < n; ++i) in.push_back(R(s));
            Check("stack " + N(t) + S(s) + std::to_string(d), "stack", in, A({d}), kExact);
        }
        for (auto [s, d, sizes] : {std::tuple<Shape, int64_t, std::vector<int64_t>>{{6, 4}, 0, {1, 2, 3}},
                                   {{2, 9, 3}, 1, {4, 0, 5}},
                                   {{5}, -1, {5}},
                                   {{4, 6}, 1, {2, 4}}}) {
            Check("split " + N(t) + S(s) + std::to_string(d), "split", {R(s)}, A({d, sizes}), kExact);
        }
    }
    for (DT t : kFloats) {
        for (auto [s, k] : {std::pair<Shape, int64_t>{{4, 4}, 0},
                            {{3, 5}, 1},
                            {{5, 3}, -1},
                            {{2, 3, 4}, 2},
                            {{2, 4, 3}, -5},
                            {{3, 3}, 10},
                            {{0, 3}, 0}}) {
            Check("tril " + N(t) + S(s) + std::to_string(k), "tril", {RandN(s, t)}, A({k}), kExact);
            Check("triu " + N(t) + S(s) + std::to_string(k), "triu", {RandN(s, t)}, A({k}), kExact);
        }
    }
}

void TestNorm() {
    const std::pair<Shape, int64_t> sm[] = {{{7}, 0},        {{1}, -1},        {{3, 17}, -1},      {{3, 17}, 0},
                                            {{2, 33, 5}, 1}, {{4, 1, 65}, -1}, {{2, 3, 4, 5}, -3}, {{64, 65}, 1},
                                            {{65, 64}, 0},   {{8, 5000}, 1},   {{3, 50257}, 1},    {{0, 5}, 1},
                                            {{3, 0}, -1},    {{2, 0, 4}, 0},   {{4096, 64}, 1}};
    for (DT t : kFloats) {
        for (auto& [s, d] : sm) {
            for (bool log : {false, true}) {
                const char* op = log ? "log_softmax" : "softmax";
                Check(std::string(op) + " " + N(t) + S(s) + std::to_string(d), op, {RandN(s, t, 3)}, A({d}), kRef64);
                Tensor x = RandN(s, DT::kFloat64, 2);
                Tensor y = Cast(GetOp(op).Call({x}, A({d}))[0], t);
                const char* bop = log ? "log_softmax_backward" : "softmax_backward";
                Check(std::string(bop) + " " + N(t) + S(s) + std::to_string(d), bop, {y, RandN(s, t)}, A({d}), kRef64);
            }
        }
        const Shape ns[] = {{65},        {1, 1},     {4, 1},      {5, 17}, {2, 3, 33}, {64, 65},
                            {3, 40, 33}, {64, 4096}, {8192, 768}, {0, 5},  {3, 0}};
        for (const Shape& s : ns) {
            int64_t C = s.back();
            Check("layernorm " + N(t) + S(s), "layernorm", {RandN(s, t, 2, 0.5), RandN({C}, t), RandN({C}, t)},
                  A({1e-5}), kRef64);
            Check("rmsnorm " + N(t) + S(s), "rmsnorm", {RandN(s, t, 2, 0.5), RandN({C}, t)}, A({1e-5}), kRef64);
            Tensor x = RandN(s, t, 2), w = RandN({C}, t), g = RandN(s, t);
            auto fw = GetOp("layernorm")
                          .Call({Cast(x, DT::kFloat64), Cast(w, DT::kFloat64), Cast(w, DT::kFloat64)}, A({1e-5}));
            double scale = s.size() > 1 && s[0] >= 1024 ? 4.0 : 1.0;  // dweight sums 8192 rows
            Check("layernorm_backward " + N(t) + S(s), "layernorm_backward",
                  {g, x, w, Cast(fw[1], Stat(t)), Cast(fw[2], Stat(t))}, {}, kRef64, scale);
            auto fr = GetOp("rmsnorm").Call({Cast(x, DT::kFloat64), Cast(w, DT::kFloat64)}, A({1e-5}));
            Check("rmsnorm_backward " + N(t) + S(s), "rmsnorm_backward", {g, x, w, Cast(fr[1], Stat(t))}, {}, kRef64,
                  scale);
        }
    }
}

void TestLoss() {
    const std::tuple<int64_t, int64_t, int64_t, double> ce[] = {
        {1, 1, -100, 0.0},  {7, 5, -100, 0.3},      {33, 65, -100, 0.2}, {17, 33, 0, 0.0},   {64, 257, -100, 0.1},
        {5, 17, -100, 1.0}, {16, 50257, -100, 0.1}, {0, 5, -100, 0.0},   {300, 1000, 3, 0.0}};
    for (DT t : kFloats) {
        for (auto& [n, v, ign, frac] : ce) {
            std::vector<double> tg(n);
            for (auto& x : tg) {
                x = std::uniform_int_distribution<int64_t>(0, v - 1)(g_rng);
                if (std::uniform_real_distribution<double>()(g_rng) < frac) x = ign;
            }
            Tensor target = Ints({n}, tg), x = RandN({n, v}, t, 3);
            std::string nm = N(t) + " " + std::to_string(n) + "x" + std::to_string(v);
            Check("cross_entropy " + nm, "cross_entropy", {x, target}, A({ign}), kRef64);
            auto fw = GetOp("cross_entropy").Call({Cast(x, DT::kFloat64), target}, A({ign}));
            Check("cross_entropy_backward " + nm, "cross_entropy_backward",
                  {x, target, Cast(fw[1], Stat(t)), FromVals({}, {1.3}, Stat(t))}, A({ign}), kRef64);
        }
    }
}

void TestOptim() {
    for (DT t : kFloats) {
        for (Shape s : {Shape{1}, Shape{7, 3}, Shape{33, 65}, Shape{4099}, Shape{0}}) {
            for (auto h :
                 {std::vector<double>{1e-2, 0.9, 0.999, 1e-8, 0.1}, std::vector<double>{3e-3, 0.8, 0.95, 1e-6, 0.0}}) {
                for (int64_t step : {1, 5}) {
                    Check("adamw_ " + N(t) + S(s) + std::to_string(step), "adamw_",
                          {RandN(s, t), RandN(s, t, 0.5), RandN(s, Stat(t), 0.1), RandU(s, Stat(t), 0.0, 0.1)},
                          A({h[0], h[1], h[2], h[3], h[4], step}), kRef64);
                }
            }
        }
    }
}

void TestAttention() {
    for (DT t : kFloats) {
        for (Shape s :
             {Shape{1, 1, 1, 2}, Shape{2, 7, 3, 8}, Shape{1, 33, 2, 16}, Shape{2, 17, 4, 64}, Shape{0, 3, 2, 4}}) {
            int64_t T = s[1], half = s[3] / 2;
            for (int64_t inv : {0, 1}) {
                Check("rope " + N(t) + S(s) + std::to_string(inv), "rope",
                      {RandN(s, t), RandU({T, half}, Stat(t), -1, 1), RandU({T, half}, Stat(t), -1, 1)}, A({inv}),
                      kRef64);
            }
        }
        const std::vector<std::vector<int64_t>> dims = {
            {1, 1, 1, 1, 1, 8},      {2, 4, 2, 7, 7, 16}, {1, 4, 4, 33, 33, 8},  {2, 4, 1, 33, 33, 64},
            {1, 2, 2, 7, 33, 16},    {3, 4, 2, 17, 1, 8}, {2, 6, 2, 64, 64, 64}, {1, 2, 1, 9, 1500, 16},
            {2, 8, 2, 256, 256, 64}, {1, 2, 1, 0, 5, 8},  {1, 2, 1, 4, 0, 8},    {1, 2, 2, 1100, 1100, 32}};
        for (auto& d : dims) {
            int64_t B = d[0], Hq = d[1], Hkv = d[2], T = d[3], S_ = d[4], D = d[5];
            for (int64_t causal : {0, 1}) {
                if (causal && T != S_) continue;
                double scale = B == 3 ? 0.7 : 1.0 / std::sqrt((double)D);
                Tensor q = RandN({B, Hq, T, D}, t), k = RandN({B, Hkv, S_, D}, t), v = RandN({B, Hkv, S_, D}, t);
                std::string nm = N(t) + " " + S(Shape(d.begin(), d.end())) + (causal ? " causal" : "");
                Check("sdpa " + nm, "sdpa", {q, k, v}, A({causal, scale}), kRef64);
                auto fw = GetOp("sdpa").Call({Cast(q, DT::kFloat64), Cast(k, DT::kFloat64), Cast(v, DT::kFloat64)},
                                             A({causal, scale}));
                Check("sdpa_backward " + nm, "sdpa_backward",
                      {RandN(q.shape(), t), q, k, v, Cast(fw[0], t), Cast(fw[1], Stat(t))}, A({causal, scale}), kRef64);
            }
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "-v")) {
            g_verbose = true;
        } else {
            g_filter = argv[i];
        }
    }
    RegisterProvider({"cuda", DT::kBFloat16, {}});
    CheckRegistrations();
    SetPoisonOutputs(true);
    int missing = 0;
    for (const Op* op : AllOps()) {
        if (!op->HasKernel(DeviceType::kPrivateUse1)) {
            printf("MISSING kernel: %s\n", op->name());
            ++missing;
        }
    }
    auto t0 = std::chrono::steady_clock::now();
    const std::pair<const char*, void (*)()> groups[] = {
        {"copy", TestCopy},     {"random", TestRandom},      {"elementwise", TestElementwise},
        {"reduce", TestReduce}, {"gemm", TestGemm},          {"index", TestIndex},
        {"shape", TestShape},   {"norm", TestNorm},          {"loss", TestLoss},
        {"optim", TestOptim},   {"attention", TestAttention}};
    for (auto& [name, fn] : groups) {
        int f0 = g_fail, c0 = g_cases;
        auto a = std::chrono::steady_clock::now();
        try {
            fn();
        } catch (const std::exception& e) {
            ++g_fail;
            printf("FAIL group %s raised: %s\n", name, e.what());
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
        printf("== %-12s %5d cases, %d failed (%.1fs)\n", name, g_cases - c0, g_fail - f0, s);
        fflush(stdout);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("TOTAL %d cases, %d failed, %d ops missing (%.1fs)\n", g_cases, g_fail, missing, s);
    return g_fail || missing ? 1 : 0;
}
