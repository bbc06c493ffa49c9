// The sim's kernels: every op's CPU kernel, run on a sim stream over host
// views of device memory. The closure holds only those views, not the tensors:
// like a GPU kernel it relies on the core allocator's stream-ordered reuse to
// keep its memory from being handed out while it runs. One generic kernel is
// registered for every op,
// except those named in INFINITRAIN_SIM_SKIP_OPS (comma-separated, read when
// this library loads), so tests can reach the composite and CPU-fallback paths.
#include <cstdlib>
#include <new>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "backends/sim/sim.h"
#include "infinitrain/allocator.h"
#include "infinitrain/op.h"
#include "infinitrain/provider.h"
#include "infinitrain/tensor.h"

namespace infinitrain::sim {
namespace {

Tensor HostTensor(const Tensor& t) {
    if (!t.defined()) return t;
    return Tensor::FromBlob(HostView(t.data()), t.shape(), t.dtype(), Device{});
}

// Rethrows the exception in flight with "<op> on sim:<d>: " before its message and its type kept (out_of_range
// stays IndexError in Python, invalid_argument ValueError...), so the error that surfaces at a later
// synchronisation names the kernel that raised it. Exceptions of other types pass unchanged.
[[noreturn]] void RethrowNamed(const std::string& op, int device) {
    const std::string at = op + " on sim:" + std::to_string(device) + ": ";
    try {
        throw;
    } catch (const MissingKernelError& e) {
        throw MissingKernelError(at + e.what());
    } catch (const OutOfMemoryError& e) {
        throw OutOfMemoryError(at + e.what());
    } catch (const std::out_of_range& e) {
        throw std::out_of_range(at + e.what());
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(at + e.what());
    } catch (const std::domain_error& e) {
        throw std::domain_error(at + e.what());
    } catch (const std::length_error& e) {
        throw std::length_error(at + e.what());
    } catch (const std::overflow_error& e) {
        throw std::overflow_error(at + e.what());
    } catch (const std::underflow_error& e) {
        throw std::underflow_error(at + e.what());
    } catch (const std::range_error& e) {
        throw std::range_error(at + e.what());
    } catch (const std::bad_alloc& e) {
        throw OutOfMemoryError(at + e.what());  // a MemoryError still, with a message
    } catch (const std::exception& e) {
        // logic_error, runtime_error and the rest: Python sees RuntimeError for all of them.
        if (typeid(e) == typeid(std::logic_error)) throw std::logic_error(at + e.what());
        if (typeid(e) == typeid(std::runtime_error)) throw std::runtime_error(at + e.what());
        throw;
    }
}

void SimKernel(KernelContext& ctx) {
    const Op* op = ctx.op;
    KernelFn cpu = op->Kernel(DeviceType::kCPU);
    if (!cpu) {
        throw MissingKernelError("op '" + std::string(op->name()) + "' has no CPU kernel for the sim to run");
    }
    std::vector<Tensor> hin, hout;
    hin.reserve(ctx.in.size());
    hout.reserve(ctx.out.size());
    for (const Tensor& t : ctx.in) hin.push_back(HostTensor(t));
    for (const Tensor& t : ctx.out) hout.push_back(HostTensor(t));
    int device = ctx.device.index;
    Enqueue(ctx.stream, [op, cpu, device, hin = std::move(hin), hout = std::move(hout), attrs = ctx.attrs]() mutable {
        KernelContext host{hin, hout, attrs, Device{}, Stream(), op};
        try {
            cpu(host);
        } catch (...) {
            RethrowNamed(op->name(), device);
        }
    });
}

std::set<std::string> SkippedOps() {
    std::set<std::string> names;
    const char* env = std::getenv("INFINITRAIN_SIM_SKIP_OPS");
    if (!env) return names;
    std::stringstream in(env);
    std::string name;
    while (std::getline(in, name, ',')) {
        size_t b = name.find_first_not_of(" \t"), e = name.find_last_not_of(" \t");
        if (b != std::string::npos) names.insert(name.substr(b, e - b + 1));
    }
    return names;
}

// AllOps() is safe here: the op table is a function-local static of the core library.
const bool kRegistered = [] {
    std::set<std::string> skip = SkippedOps();
    for (const Op* op : AllOps()) {
        if (!skip.count(op->name())) AddProviderKernel(kName, op->name(), &SimKernel, INFINITRAIN_SITE);
    }
    return true;
}();

}  // namespace
}  // namespace infinitrain::sim
