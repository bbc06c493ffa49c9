// The provider mechanism without Python: what a provider adds from file scope stays inert until
// RegisterProvider checks all of it; a malformed provider (no runtime, a kernel for an unknown op, a
// misnamed or duplicate op) is refused with every problem named and nothing activated; a good one claims the
// PrivateUse1 slot with its runtime, kernels and ops; registering it again changes nothing; a second provider
// is refused while the slot is held.
#include "infinitrain/provider.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "infinitrain/op.h"
#include "infinitrain/privateuse1.h"
#include "infinitrain/runtime.h"
#include "tests/cc/check.h"

using namespace infinitrain;

namespace {

// A device on host memory, enough for registration and the caching allocator: one device, one stream.
class HostRuntime : public DeviceRuntime {
public:
    DeviceType type() const override { return DeviceType::kPrivateUse1; }
    int DeviceCount() override { return 1; }
    void SetDevice(int) override {}
    void* RawAlloc(size_t nbytes, int) override { return std::malloc(nbytes); }
    void RawFree(void* ptr, int) override { std::free(ptr); }
    void MemcpyAsync(void* dst, const void* src, size_t n, MemcpyKind, const Stream&) override {
        std::memcpy(dst, src, n);
    }
    void MemsetAsync(void* ptr, int value, size_t n, const Stream&) override { std::memset(ptr, value, n); }
    Stream CreateStream(int device) override { return Stream({DeviceType::kPrivateUse1, device}, nullptr); }
    void SynchronizeStream(const Stream&) override {}
    void StreamWaitEvent(const Stream&, const Event&) override {}
    Event CreateEvent(int device) override { return Event({DeviceType::kPrivateUse1, device}, nullptr); }
    void DestroyEvent(const Event&) override {}
    void RecordEvent(const Event&, const Stream&) override {}
    bool QueryEvent(const Event&) override { return true; }
    void SynchronizeEvent(const Event&) override {}
    float ElapsedMs(const Event&, const Event&) override { return 0.0f; }
    void SynchronizeDevice(int) override {}
};

void NoKernel(KernelContext&) {}
std::vector<TensorMeta> SameAsInput(const char*, const std::vector<Tensor>& in, const Attrs&) {
    return {TensorMeta{in[0].shape(), in[0].dtype()}};
}

// The file scope of three providers' libraries: `good`, `broken` (a kernel for an op that does not exist, an op
// outside its namespace, an op defined twice) and `other` (well formed, for the held slot).
REGISTER_PROVIDER_RUNTIME("good", HostRuntime);
REGISTER_PROVIDER_KERNEL("good", "add", NoKernel);
REGISTER_PROVIDER_OP("good", (OpDef{"good.twice(x) -> out", OpTier::kProvider, kAllDtypes, "", SameAsInput, "2x"}),
                     NoKernel, nullptr);
REGISTER_PROVIDER_RUNTIME("broken", HostRuntime);
REGISTER_PROVIDER_KERNEL("broken", "no_such_op", NoKernel);
REGISTER_PROVIDER_OP("broken", (OpDef{"elsewhere.op(x) -> out", OpTier::kProvider, kAllDtypes, "", SameAsInput, ""}),
                     NoKernel, nullptr);
REGISTER_PROVIDER_OP("broken", (OpDef{"broken.op(x) -> out", OpTier::kProvider, kAllDtypes, "", SameAsInput, ""}),
                     NoKernel, nullptr);
REGISTER_PROVIDER_OP("broken", (OpDef{"broken.op(x) -> out", OpTier::kProvider, kAllDtypes, "", SameAsInput, ""}),
                     NoKernel, nullptr);
REGISTER_PROVIDER_RUNTIME("other", HostRuntime);

bool IsOp(const char* name) {
    try {
        GetOp(name);
        return true;
    } catch (const std::invalid_argument&) {
        return false;
    }
}

void TestNothingIsLiveBeforeRegistration() {
    std::vector<std::string> loaded = LoadedProviders();
    CHECK(loaded.size() == 3);
    CHECK(GetPrivateUse1() == nullptr);
    CHECK(!HasRuntime(DeviceType::kPrivateUse1));
    CHECK(!IsOp("good.twice"));
    CHECK(!GetOp("add").HasKernel(DeviceType::kPrivateUse1));
}

void TestAMalformedProviderIsRefusedWithEveryProblem() {
    CHECK_THROWS(RegisterProvider({"absent"}), std::runtime_error, "provider 'absent' added no device runtime");
    CHECK_THROWS(RegisterProvider({"broken"}), std::runtime_error, "unknown op 'no_such_op'");
    CHECK_THROWS(RegisterProvider({"broken"}), std::runtime_error, "must be named 'broken.<op>'");
    CHECK_THROWS(RegisterProvider({"broken"}), std::runtime_error, "op 'broken.op' is defined twice");
    CHECK(GetPrivateUse1() == nullptr);  // refused: nothing activated
    CHECK(!HasRuntime(DeviceType::kPrivateUse1) && !IsOp("broken.op"));
    CHECK_THROWS(RegisterProvider({"bad:name"}), std::runtime_error, "added no device runtime");
}

void TestAGoodProviderActivatesEverything() {
    RegisterProvider({"good", DataType::kFloat16});
    CHECK(GetPrivateUse1() != nullptr && GetPrivateUse1()->name == "good");
    CHECK(GetPrivateUse1()->autocast_dtype == DataType::kFloat16);
    CHECK(HasRuntime(DeviceType::kPrivateUse1) && GetRuntime(DeviceType::kPrivateUse1).DeviceCount() == 1);
    CHECK(GetOp("add").HasKernel(DeviceType::kPrivateUse1));
    CHECK(IsOp("good.twice") && GetOp("good.twice").HasKernel(DeviceType::kPrivateUse1));
    CHECK(std::string(GetOp("add").KernelSite(DeviceType::kPrivateUse1)).find("provider_test.cc") != std::string::npos);
    RegisterProvider({"good", DataType::kFloat16});  // again: idempotent
    CHECK_THROWS(RegisterProvider({"good", DataType::kBFloat16}), std::runtime_error, "good");
    CHECK_THROWS(RegisterProvider({"other"}), std::runtime_error, "provider 'good'");  // the slot is held
    CHECK(GetPrivateUse1()->name == "good");
}

}  // namespace

int main() {
    TestNothingIsLiveBeforeRegistration();
    TestAMalformedProviderIsRefusedWithEveryProblem();
    TestAGoodProviderActivatesEverything();
    return ::infinitrain::testing::Failures();
}
