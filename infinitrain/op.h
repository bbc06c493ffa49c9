// The op contract: one schema per op (name, tier, inputs, attributes,
// outputs, dtypes, backward ops, shape rule) and the dispatcher that maps
// (device type, op name) to a kernel. The schema table in op_table.cc is the
// single source that the dispatcher, the Python autograd layer, the tests and
// the conformance report read.
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

// Attributes are positional, in the order the schema's `attrs` string lists them.
using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;
using Attrs = std::vector<AttrValue>;

struct TensorMeta {
    Shape shape;
    DataType dtype;
};

// Validates inputs and attributes and returns the outputs' shapes and dtypes.
using MetaFn = std::vector<TensorMeta> (*)(const std::vector<Tensor>& in, const Attrs& attrs);

enum class OpTier { kRequired, kFused };

struct OpSchema {
    const char* name;
    OpTier tier;
    const char* inputs;    // e.g. "x, weight, bias?"; "xs..." is variadic
    const char* attrs;     // e.g. "dim:int, keepdim:int"
    const char* outputs;   // e.g. "out, mean, rstd"
    const char* dtypes;    // dtypes of the main floating input, e.g. "float32 bfloat16 float64"
    const char* backward;  // ops the autograd backward uses ("" when not differentiable)
    const char* doc;       // one line: what it computes, shapes and broadcasting
    MetaFn meta;
    int min_inputs;
    int max_inputs;            // -1: unbounded
    std::vector<int> inplace;  // inputs the kernel writes in place
};

class Op;

struct KernelContext {
    const std::vector<Tensor>& in;
    std::vector<Tensor>& out;
    const Attrs& attrs;
    Device device;
    Stream stream;  // the device's current stream for the calling thread
    const Op* op;

    int64_t i(size_t k) const;
    double f(size_t k) const;
    const std::vector<int64_t>& ints(size_t k) const;
    const std::string& s(size_t k) const;
};

using KernelFn = void (*)(KernelContext& ctx);

// Raised when an op has no kernel on a device type (Python maps it to NotImplementedError).
class MissingKernelError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class Op {
public:
    explicit Op(OpSchema schema) : schema_(std::move(schema)) {}
    const OpSchema& schema() const { return schema_; }
    const char* name() const { return schema_.name; }
    bool HasKernel(DeviceType t) const { return kernels_[static_cast<int>(t)] != nullptr; }
    KernelFn Kernel(DeviceType t) const { return kernels_[static_cast<int>(t)]; }
    const char* KernelSite(DeviceType t) const { return sites_[static_cast<int>(t)]; }

    // Validates, allocates the outputs on the inputs' device and runs the kernel.
    std::vector<Tensor> Call(const std::vector<Tensor>& in, const Attrs& attrs) const;
    // Validates inputs and attributes and returns the outputs' shapes and dtypes.
    std::vector<TensorMeta> Meta(const std::vector<Tensor>& in, const Attrs& attrs) const;

private:
    friend void RegisterKernel(DeviceType, const char*, KernelFn, const char*);
    OpSchema schema_;
    mutable std::atomic<bool> warned_fallback_{false};
    KernelFn kernels_[kNumDeviceTypes] = {};
    const char* sites_[kNumDeviceTypes] = {};
};

// Raises std::invalid_argument listing close names when `name` is unknown.
const Op& GetOp(const std::string& name);
std::vector<const Op*> AllOps();

// Registration errors (unknown op, duplicate kernel) are collected during
// static initialisation and raised by CheckRegistrations(), which the Python
// module calls at import: throwing from static init would abort the process.
void RegisterKernel(DeviceType type, const char* op, KernelFn fn, const char* site);
void CheckRegistrations();

// When on, an op with no kernel on a device runs its CPU kernel on host copies
// of the inputs and copies the outputs back, warning once per op (bring-up aid).
void SetCpuFallback(bool on);
bool CpuFallback();
// Receives one-time warnings (the Python module routes them to `warnings`).
void SetWarningHandler(std::function<void(const std::string&)> handler);

// When on, every output is filled with 0xFF bytes (NaN for floats) before its
// kernel runs, so a kernel that leaves elements unwritten fails the tests.
void SetPoisonOutputs(bool on);
bool PoisonOutputs();

struct KernelRegistrar {
    KernelRegistrar(DeviceType type, const char* op, KernelFn fn, const char* site) {
        RegisterKernel(type, op, fn, site);
    }
};

#define REGISTER_KERNEL(device_type, op, fn)                                               \
    static ::infinitrain::KernelRegistrar INFINITRAIN_CONCAT(kernel_registrar_, __LINE__)( \
        device_type, op, fn, __FILE__ ":" INFINITRAIN_STR(__LINE__))

// Helpers for meta functions and kernels.
[[noreturn]] void OpError(const char* op, const std::string& what);  // raises std::invalid_argument
int64_t NormalizeDim(const char* op, int64_t dim, int64_t ndim);
Shape BroadcastShapes(const char* op, const Shape& a, const Shape& b);

}  // namespace infinitrain
