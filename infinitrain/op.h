// The op contract and the dispatcher. Every op is one line of the op table
// (op_table.cc): a schema string such as
//
//   layernorm(x, weight, bias; eps: float) -> (out, mean, rstd)
//
// (inputs; typed attributes) -> outputs, with `?` for an optional input, `...`
// for a variadic one, `!` for an input the op writes in place (`xs!...`: every
// input from that position on) and `: int64` (any dtype name) for an input of
// a fixed dtype; plus its tier, the dtypes its first other input accepts, the
// ops its backward uses, a named shape rule and one line of doc. The table is
// the single source that the dispatcher, the Python autograd layer, the tests,
// docs/ops.md and the conformance report read. Providers may add ops of their
// own (provider.h).
//
// Op::Call validates the inputs against the schema and the shape rule,
// allocates the outputs on the inputs' device, and runs, in this order of
// preference: the device type's kernel, the op's composite (a definition in
// terms of other ops), the CPU kernel on host copies when the provider turned
// its CPU fallback on, or raises MissingKernelError.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "infinitrain/runtime.h"
#include "infinitrain/tensor.h"

namespace infinitrain {

// Attributes are positional, in the order the schema lists them.
using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;
using Attrs = std::vector<AttrValue>;

struct TensorMeta {
    Shape shape;
    DataType dtype;
};

// Checks what the schema cannot (shapes, dtypes of other inputs, attribute ranges) and returns the
// outputs' shapes and dtypes; raises std::invalid_argument (OpError) naming `op`. The input count, the
// attributes' count and types and the inputs' schema dtypes are checked before it runs.
using ShapeRule = std::vector<TensorMeta> (*)(const char* op, const std::vector<Tensor>& in, const Attrs& attrs);

enum class OpTier { kRequired, kFused, kProvider };

// A set of dtypes, one bit per DataType.
using DtypeSet = uint16_t;
constexpr DtypeSet DtypeBit(DataType t) { return static_cast<DtypeSet>(1u << static_cast<int>(t)); }
constexpr DtypeSet kFloatDtypes = DtypeBit(DataType::kFloat32) | DtypeBit(DataType::kBFloat16) |
                                  DtypeBit(DataType::kFloat16) | DtypeBit(DataType::kFloat64);
constexpr DtypeSet kNumericDtypes = kFloatDtypes | DtypeBit(DataType::kInt32) | DtypeBit(DataType::kInt64);
// Every dtype ops compute with: all but the float8 storage types, which only the fp8 ops and cast take.
constexpr DtypeSet kAllDtypes = (1u << static_cast<int>(DataType::kFloat8E4M3)) - 1;
constexpr DtypeSet kFloat8Dtypes = DtypeBit(DataType::kFloat8E4M3) | DtypeBit(DataType::kFloat8E5M2);
std::string DtypeSetName(DtypeSet s);  // "float32 bfloat16 float16 float64", "all"

// One line of the op table.
struct OpDef {
    const char* schema;  // "name(inputs; attrs) -> outputs"
    OpTier tier;
    DtypeSet dtypes;       // dtypes the first input without a fixed dtype accepts
    const char* backward;  // ops the autograd backward uses, space-separated ("" when not differentiable)
    ShapeRule shape;
    const char* doc;  // one line: what it computes, shapes and broadcasting
};

enum class AttrType { kInt, kFloat, kInts, kStr };

// An OpDef with its schema string parsed.
struct OpSchema {
    struct Input {
        std::string name;
        bool optional = false;
        bool variadic = false;
        bool written = false;  // written in place (`!`)
        int dtype = -1;        // a fixed DataType (`index: int64`), or -1
    };
    struct Attr {
        std::string name;
        AttrType type;
    };
    std::string name;
    std::string text;  // the schema string
    std::vector<Input> inputs;
    std::vector<Attr> attrs;
    std::vector<std::string> outputs;  // a last name ending in "..." is variadic
    int min_inputs = 0;
    int max_inputs = 0;        // -1: unbounded
    int typed_input = 0;       // the first input without a fixed dtype: `dtypes` applies to it
    std::vector<int> inplace;  // positions in `inputs` of the written ones (`!`)
    // The indices of the tensors a call with num_inputs inputs writes: a written variadic input covers every
    // input from its position on, an absent optional one none.
    std::vector<int> Written(int num_inputs) const;
    OpTier tier = OpTier::kRequired;
    DtypeSet dtypes = kAllDtypes;
    std::vector<std::string> backward;
    ShapeRule shape = nullptr;
    std::string doc;
};

// Parses def.schema; raises std::invalid_argument saying what is malformed.
OpSchema ParseOpSchema(const OpDef& def);

class Op;

struct KernelContext {
    const std::vector<Tensor>& in;
    std::vector<Tensor>& out;
    const Attrs& attrs;
    Device device;
    Stream stream;  // the current stream of `device` for the calling thread; `device` is current too
    const Op* op;

    int64_t i(size_t k) const { return std::get<int64_t>(attrs[k]); }
    double f(size_t k) const;
    const std::vector<int64_t>& ints(size_t k) const { return std::get<std::vector<int64_t>>(attrs[k]); }
    const std::string& s(size_t k) const { return std::get<std::string>(attrs[k]); }
};

using KernelFn = void (*)(KernelContext& ctx);
// A definition of an op in terms of other ops: validated inputs and attributes in, outputs out (in-place
// ops write their inputs and return nothing).
using CompositeFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& in, const Attrs& attrs)>;

// Raised when an op cannot run on a device (Python maps it to NotImplementedError).
class MissingKernelError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

enum class HowRuns { kNative, kComposite, kCpuFallback, kMissing };
const char* HowRunsName(HowRuns how);  // "native", "composite", "cpu-fallback", "missing"

class Op {
public:
    explicit Op(OpSchema schema) : schema_(std::move(schema)) {}
    const OpSchema& schema() const { return schema_; }
    const char* name() const { return schema_.name.c_str(); }
    bool HasKernel(DeviceType t) const { return kernels_[static_cast<int>(t)] != nullptr; }
    KernelFn Kernel(DeviceType t) const { return kernels_[static_cast<int>(t)]; }
    const char* KernelSite(DeviceType t) const { return sites_[static_cast<int>(t)]; }
    bool HasComposite() const { return static_cast<bool>(composite_); }
    // How Call would run the op on a device of type t.
    HowRuns How(DeviceType t) const;

    // Validates, then runs the op as How says (outputs allocated on the inputs' device).
    std::vector<Tensor> Call(const std::vector<Tensor>& in, const Attrs& attrs) const;
    // Validates, then runs the composite even where a kernel exists (to check composites).
    std::vector<Tensor> CallComposite(const std::vector<Tensor>& in, const Attrs& attrs) const;
    // Validates inputs and attributes; returns the outputs' shapes and dtypes.
    std::vector<TensorMeta> Meta(const std::vector<Tensor>& in, const Attrs& attrs) const;

    // Sets the composite (once; a second one raises).
    void SetComposite(CompositeFn fn);
    // While on, Call runs the composite even where a kernel exists (tests compare the two paths).
    void PreferComposite(bool on) { prefer_composite_ = on && composite_; }

private:
    friend void RegisterKernel(DeviceType, const char*, KernelFn, const char*);
    friend class OpRegistry;
    std::vector<Tensor> RunKernel(KernelFn fn, const Device& device, const std::vector<Tensor>& in,
                                  const std::vector<TensorMeta>& metas, const Attrs& attrs) const;
    std::vector<Tensor> RunWithoutKernel(const Device& device, const std::vector<Tensor>& in,
                                         const std::vector<TensorMeta>& metas, const Attrs& attrs) const;

    OpSchema schema_;
    CompositeFn composite_;
    std::atomic<bool> prefer_composite_{false};
    mutable std::atomic<bool> warned_fallback_{false};
    KernelFn kernels_[kNumDeviceTypes] = {};
    const char* sites_[kNumDeviceTypes] = {};
};

// Raises std::invalid_argument naming the docs when `name` is unknown.
const Op& GetOp(const std::string& name);
// Runs op `name`'s kernel for ctx's device inside a running kernel (same thread, stream and device), on tensors
// the caller allocated: for kernels built from other ops' kernels (sdpa_bthd's transposes are permute's).
void RunKernelOf(const char* name, const KernelContext& ctx, const std::vector<Tensor>& in, std::vector<Tensor>& out,
                 const Attrs& attrs);
Op& GetMutableOp(const std::string& name);
std::vector<const Op*> AllOps();  // table order, then provider ops in the order they were added

// Adds an op (a provider's: its name must be "<provider>.<op>"); raises for a malformed or duplicate schema.
void AddOp(const OpDef& def);

// Registration errors (unknown op, duplicate kernel) are collected during
// static initialisation and raised by CheckRegistrations(), which the Python
// module calls at import: throwing from static init would abort the process.
void RegisterKernel(DeviceType type, const char* op, KernelFn fn, const char* site);
void CheckRegistrations();

// Per device type: when on, an op with no kernel and no composite runs its CPU kernel on host copies of
// the inputs and copies the outputs back, warning once per op (a bring-up aid; off by default).
void SetCpuFallback(DeviceType type, bool on);
bool CpuFallback(DeviceType type);
// Receives one-time warnings (the Python module routes them to `warnings`).
void SetWarningHandler(std::function<void(const std::string&)> handler);

// When on, every output is filled with 0xFF bytes (NaN for floats) before its
// kernel runs, so a kernel that leaves elements unwritten fails the tests.
void SetPoisonOutputs(bool on);
bool PoisonOutputs();

// float32 matrix products (GEMMs, attention's GEMM path): "highest" computes in float32; "high" and "medium" let a
// provider use reduced-precision tensor cores (TF32 on CUDA GPUs), as PyTorch's set_float32_matmul_precision. Read by
// kernels at every call; "highest" by default.
enum class MatmulPrecision { kHighest, kHigh, kMedium };
void SetFloat32MatmulPrecision(MatmulPrecision p);
MatmulPrecision Float32MatmulPrecision();

struct KernelRegistrar {
    KernelRegistrar(DeviceType type, const char* op, KernelFn fn, const char* site) {
        RegisterKernel(type, op, fn, site);
    }
};

#define REGISTER_KERNEL(device_type, op, fn)                                               \
    static ::infinitrain::KernelRegistrar INFINITRAIN_CONCAT(kernel_registrar_, __LINE__)( \
        device_type, op, fn, __FILE__ ":" INFINITRAIN_STR(__LINE__))

// Helpers for shape rules and kernels.
[[noreturn]] void OpError(const char* op, const std::string& what);  // raises std::invalid_argument
int64_t NormalizeDim(const char* op, int64_t dim, int64_t ndim);
Shape BroadcastShapes(const char* op, const Shape& a, const Shape& b);

}  // namespace infinitrain
