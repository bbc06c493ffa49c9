// The CCL of a CUDA-dialect provider, written once through the vendor
// header's GPU_CCL names (NCCL's nccl*, MCCL's mccl*, which mirror each
// other). One process may drive several GPUs (InitAll) or one GPU per process
// with a unique id passed between ranks (InitRank). Collectives are enqueued
// on the stream they are given; 16-bit floats reduce natively.
//
// Large all-reduces are cut into segments of INFINITRAIN_CCL_SEGMENT_MB MiB
// (0: never; the default is the vendor's kAllReduceSegmentBytes, 160 MiB on
// MACA, where users report whole huge all-reduces losing bandwidth).
#include "infinitrain/ccl.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/gpu/vendor.h"
#include "infinitrain/provider.h"

namespace infinitrain::gpu {
namespace {

void CheckCcl(CclResult r, const char* what) {
    if (r == GPU_CCL(Success)) return;
    throw std::runtime_error(std::string(kProviderName) + " CCL: " + what + ": " + GPU_CCL(GetErrorString)(r));
}

CclDataType CclType(DataType t) {
    switch (t) {
        case DataType::kBool:
        case DataType::kUInt8:
        case DataType::kFloat8E4M3:  // moved as bytes; never reduced (CclOp refuses)
        case DataType::kFloat8E5M2:
            return GPU_CCL(Uint8);
        case DataType::kInt8:
            return GPU_CCL(Int8);
        case DataType::kInt32:
            return GPU_CCL(Int32);
        case DataType::kInt64:
            return GPU_CCL(Int64);
        case DataType::kFloat16:
            return GPU_CCL(Float16);
        case DataType::kBFloat16:
            return GPU_CCL(Bfloat16);
        case DataType::kFloat32:
            return GPU_CCL(Float32);
        case DataType::kFloat64:
            return GPU_CCL(Float64);
    }
    throw std::invalid_argument("CCL: unknown dtype");
}

CclRedOp CclOp(ReduceOp op, DataType t) {
    if (t == DataType::kBool) throw std::invalid_argument("CCL: cannot reduce a bool buffer");
    if (IsFloat8(t)) throw std::invalid_argument("CCL: cannot reduce a float8 buffer (reduce in a wider float)");
    switch (op) {
        case ReduceOp::kSum:
            return GPU_CCL(Sum);
        case ReduceOp::kAvg:
            return GPU_CCL(Avg);
        case ReduceOp::kMax:
            return GPU_CCL(Max);
        case ReduceOp::kMin:
            return GPU_CCL(Min);
        case ReduceOp::kProd:
            return GPU_CCL(Prod);
    }
    return GPU_CCL(Sum);
}

NativeStream_t Native(const Stream& s) { return static_cast<NativeStream_t>(s.handle()); }

int64_t SegmentBytes() {
    static const int64_t bytes = [] {
        const char* e = std::getenv("INFINITRAIN_CCL_SEGMENT_MB");
        if (!e || !*e) return kAllReduceSegmentBytes;
        char* end = nullptr;
        long long mb = std::strtoll(e, &end, 10);
        if (*end || mb < 0) {
            throw std::invalid_argument(std::string("INFINITRAIN_CCL_SEGMENT_MB='") + e +
                                        "': expected a whole number of MiB (0: all-reduces are not segmented)");
        }
        return static_cast<int64_t>(mb) << 20;
    }();
    return bytes;
}

class GpuCommunicator final : public Communicator {
public:
    GpuCommunicator(CclComm comm, int rank, int size, Device device)
        : comm_(comm), rank_(rank), size_(size), device_(device) {}
    ~GpuCommunicator() override { GPU_CCL(CommDestroy)(comm_); }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    Device device() const override { return device_; }

    void AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                   const Stream& stream) override {
        // In segments where the vendor wants them; each is an independent all-reduce, in order on the stream.
        const size_t es = DataTypeSize(dtype);
        const size_t seg = SegmentBytes() > 0 ? std::max<size_t>(1, static_cast<size_t>(SegmentBytes()) / es) : count;
        size_t off = 0;
        do {
            const size_t n = std::min(seg, count - off);
            CheckCcl(GPU_CCL(AllReduce)(static_cast<const char*>(send) + off * es, static_cast<char*>(recv) + off * es,
                                        n, CclType(dtype), CclOp(op, dtype), comm_, Native(stream)),
                     "AllReduce");
            off += n;
        } while (off < count);
    }
    void Broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                   const Stream& stream) override {
        CheckCcl(GPU_CCL(Broadcast)(send, recv, count, CclType(dtype), root, comm_, Native(stream)), "Broadcast");
    }
    void Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
                const Stream& stream) override {
        CheckCcl(GPU_CCL(Reduce)(send, recv, count, CclType(dtype), CclOp(op, dtype), root, comm_, Native(stream)),
                 "Reduce");
    }
    void AllGather(const void* send, void* recv, size_t count, DataType dtype, const Stream& stream) override {
        CheckCcl(GPU_CCL(AllGather)(send, recv, count, CclType(dtype), comm_, Native(stream)), "AllGather");
    }
    void ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       const Stream& stream) override {
        CheckCcl(GPU_CCL(ReduceScatter)(send, recv, count, CclType(dtype), CclOp(op, dtype), comm_, Native(stream)),
                 "ReduceScatter");
    }
    void Send(const void* buf, size_t count, DataType dtype, int peer, const Stream& stream) override {
        CheckCcl(GPU_CCL(Send)(buf, count, CclType(dtype), peer, comm_, Native(stream)), "Send");
    }
    void Recv(void* buf, size_t count, DataType dtype, int peer, const Stream& stream) override {
        CheckCcl(GPU_CCL(Recv)(buf, count, CclType(dtype), peer, comm_, Native(stream)), "Recv");
    }
    std::string AsyncError() override {
        CclResult r = GPU_CCL(Success);
        if (GPU_CCL(CommGetAsyncError)(comm_, &r) != GPU_CCL(Success) || r == GPU_CCL(Success)) return "";
        return std::string(kProviderName) + " CCL: " + GPU_CCL(GetErrorString)(r);
    }

private:
    CclComm comm_;
    int rank_, size_;
    Device device_;
};

class GpuCcl final : public CclBackend {
public:
    CclUniqueId GetUniqueId() override {
        static_assert(sizeof(CclId) == sizeof(CclUniqueId), "the CCL's unique id is 128 bytes");
        CclId id;
        CheckCcl(GPU_CCL(GetUniqueId)(&id), "GetUniqueId");
        CclUniqueId out;
        std::memcpy(out.data(), &id, sizeof(id));
        return out;
    }

    std::unique_ptr<Communicator> InitRank(const CclUniqueId& id, int nranks, int rank, Device device) override {
        CclId nid;
        std::memcpy(&nid, id.data(), sizeof(nid));
        CclComm comm = nullptr;
        CheckCcl(GPU_CCL(CommInitRank)(&comm, nranks, nid, rank), "CommInitRank");  // on the current device
        return std::make_unique<GpuCommunicator>(comm, rank, nranks, device);
    }

    std::vector<std::unique_ptr<Communicator>> InitAll(const std::vector<Device>& devices) override {
        std::vector<int> ids;
        for (const Device& d : devices) ids.push_back(d.index);
        std::vector<CclComm> comms(devices.size());
        CheckCcl(GPU_CCL(CommInitAll)(comms.data(), static_cast<int>(devices.size()), ids.data()), "CommInitAll");
        std::vector<std::unique_ptr<Communicator>> out;
        for (size_t i = 0; i < devices.size(); ++i) {
            out.push_back(std::make_unique<GpuCommunicator>(comms[i], static_cast<int>(i),
                                                            static_cast<int>(devices.size()), devices[i]));
        }
        return out;
    }

    void GroupStart() override { CheckCcl(GPU_CCL(GroupStart)(), "GroupStart"); }
    void GroupEnd() override { CheckCcl(GPU_CCL(GroupEnd)(), "GroupEnd"); }
};

}  // namespace

REGISTER_PROVIDER_CCL(kProviderName, GpuCcl);

}  // namespace infinitrain::gpu
