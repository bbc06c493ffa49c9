// The cuda provider's CCL: NCCL behind the CCL interface. One process may
// drive several GPUs (InitAll, ncclCommInitAll) or one GPU per process with
// a unique id passed between ranks (InitRank). Collectives are enqueued on the
// stream they are given; NCCL reduces bfloat16 and float16 natively.
#include "infinitrain/ccl.h"

#include <nccl.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/cuda.h"
#include "infinitrain/provider.h"

namespace infinitrain::cuda {
namespace {

void CheckNccl(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    throw std::runtime_error(std::string("nccl: ") + what + ": " + ncclGetErrorString(r) + " (" +
                             ncclGetLastError(nullptr) + ")");
}

ncclDataType_t NcclType(DataType t) {
    switch (t) {
        case DataType::kBool:
        case DataType::kUInt8:
            return ncclUint8;
        case DataType::kInt8:
            return ncclInt8;
        case DataType::kInt32:
            return ncclInt32;
        case DataType::kInt64:
            return ncclInt64;
        case DataType::kFloat16:
            return ncclFloat16;
        case DataType::kBFloat16:
            return ncclBfloat16;
        case DataType::kFloat32:
            return ncclFloat32;
        case DataType::kFloat64:
            return ncclFloat64;
    }
    throw std::invalid_argument("nccl: unknown dtype");
}

ncclRedOp_t NcclOp(ReduceOp op, DataType t) {
    if (t == DataType::kBool) throw std::invalid_argument("nccl: cannot reduce a bool buffer");
    switch (op) {
        case ReduceOp::kSum:
            return ncclSum;
        case ReduceOp::kAvg:
            return ncclAvg;
        case ReduceOp::kMax:
            return ncclMax;
        case ReduceOp::kMin:
            return ncclMin;
        case ReduceOp::kProd:
            return ncclProd;
    }
    return ncclSum;
}

cudaStream_t Native(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

class NcclCommunicator final : public Communicator {
public:
    NcclCommunicator(ncclComm_t comm, int rank, int size, Device device)
        : comm_(comm), rank_(rank), size_(size), device_(device) {}
    ~NcclCommunicator() override { ncclCommDestroy(comm_); }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    Device device() const override { return device_; }

    void AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                   const Stream& stream) override {
        CheckNccl(ncclAllReduce(send, recv, count, NcclType(dtype), NcclOp(op, dtype), comm_, Native(stream)),
                  "ncclAllReduce");
    }
    void Broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                   const Stream& stream) override {
        CheckNccl(ncclBroadcast(send, recv, count, NcclType(dtype), root, comm_, Native(stream)), "ncclBroadcast");
    }
    void Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
                const Stream& stream) override {
        CheckNccl(ncclReduce(send, recv, count, NcclType(dtype), NcclOp(op, dtype), root, comm_, Native(stream)),
                  "ncclReduce");
    }
    void AllGather(const void* send, void* recv, size_t count, DataType dtype, const Stream& stream) override {
        CheckNccl(ncclAllGather(send, recv, count, NcclType(dtype), comm_, Native(stream)), "ncclAllGather");
    }
    void ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       const Stream& stream) override {
        CheckNccl(ncclReduceScatter(send, recv, count, NcclType(dtype), NcclOp(op, dtype), comm_, Native(stream)),
                  "ncclReduceScatter");
    }
    void Send(const void* buf, size_t count, DataType dtype, int peer, const Stream& stream) override {
        CheckNccl(ncclSend(buf, count, NcclType(dtype), peer, comm_, Native(stream)), "ncclSend");
    }
    void Recv(void* buf, size_t count, DataType dtype, int peer, const Stream& stream) override {
        CheckNccl(ncclRecv(buf, count, NcclType(dtype), peer, comm_, Native(stream)), "ncclRecv");
    }
    std::string AsyncError() override {
        ncclResult_t r = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess || r == ncclSuccess) return "";
        return std::string("nccl: ") + ncclGetErrorString(r);
    }

private:
    ncclComm_t comm_;
    int rank_, size_;
    Device device_;
};

class NcclBackend final : public CclBackend {
public:
    CclUniqueId GetUniqueId() override {
        static_assert(sizeof(ncclUniqueId) == sizeof(CclUniqueId), "NCCL's unique id is 128 bytes");
        ncclUniqueId id;
        CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
        CclUniqueId out;
        std::memcpy(out.data(), &id, sizeof(id));
        return out;
    }

    std::unique_ptr<Communicator> InitRank(const CclUniqueId& id, int nranks, int rank, Device device) override {
        ncclUniqueId nid;
        std::memcpy(&nid, id.data(), sizeof(nid));
        Check(cudaSetDevice(device.index), "cudaSetDevice");
        ncclComm_t comm = nullptr;
        CheckNccl(ncclCommInitRank(&comm, nranks, nid, rank), "ncclCommInitRank");
        return std::make_unique<NcclCommunicator>(comm, rank, nranks, device);
    }

    std::vector<std::unique_ptr<Communicator>> InitAll(const std::vector<Device>& devices) override {
        std::vector<int> ids;
        for (const Device& d : devices) ids.push_back(d.index);
        std::vector<ncclComm_t> comms(devices.size());
        CheckNccl(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), ids.data()), "ncclCommInitAll");
        std::vector<std::unique_ptr<Communicator>> out;
        for (size_t i = 0; i < devices.size(); ++i) {
            out.push_back(std::make_unique<NcclCommunicator>(comms[i], static_cast<int>(i),
                                                             static_cast<int>(devices.size()), devices[i]));
        }
        return out;
    }

    void GroupStart() override { CheckNccl(ncclGroupStart(), "ncclGroupStart"); }
    void GroupEnd() override { CheckNccl(ncclGroupEnd(), "ncclGroupEnd"); }
};

}  // namespace

REGISTER_PROVIDER_CCL(kName, NcclBackend);

}  // namespace infinitrain::cuda
