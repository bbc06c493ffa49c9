// Collective communication (CCL): an optional per-provider interface modelled
// on NCCL. A communicator belongs to one device; collectives are enqueued on a
// stream of that device and complete asynchronously.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "infinitrain/device.h"
#include "infinitrain/dtype.h"
#include "infinitrain/runtime.h"

namespace infinitrain {

enum class ReduceOp { kSum, kAvg, kMax, kMin, kProd };

ReduceOp ParseReduceOp(const std::string& name);  // "sum", "avg", "max", "min", "prod"

// Opaque bytes naming one communicator group across processes (NCCL's is 128 bytes).
using CclUniqueId = std::array<uint8_t, 128>;

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual Device device() const = 0;

    // count elements of dtype; buffers live on device(). In-place when send == recv.
    virtual void AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                           const Stream& stream) = 0;
    virtual void Broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                           const Stream& stream) = 0;
    virtual void Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
                        const Stream& stream) = 0;
    // recv holds size() * count elements, rank r's contribution at r * count.
    virtual void AllGather(const void* send, void* recv, size_t count, DataType dtype, const Stream& stream) = 0;
    // send holds size() * count elements; recv gets the reduction of block rank().
    virtual void ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                               const Stream& stream) = 0;
    virtual void Send(const void* buf, size_t count, DataType dtype, int peer, const Stream& stream) = 0;
    virtual void Recv(void* buf, size_t count, DataType dtype, int peer, const Stream& stream) = 0;
    // An error raised asynchronously by an earlier collective, or "" when none.
    virtual std::string AsyncError() = 0;
};

class CclBackend {
public:
    virtual ~CclBackend() = default;
    virtual CclUniqueId GetUniqueId() = 0;
    // One device per process: this process's rank in a group of nranks named by id.
    virtual std::unique_ptr<Communicator> InitRank(const CclUniqueId& id, int nranks, int rank, Device device) = 0;
    // One process, many devices: communicators for all of them, rank i on devices[i].
    virtual std::vector<std::unique_ptr<Communicator>> InitAll(const std::vector<Device>& devices) = 0;
    // Calls between GroupStart and GroupEnd from one thread may wait on each other (as in NCCL).
    virtual void GroupStart() = 0;
    virtual void GroupEnd() = 0;
    // Whether InitRank joins ranks in other processes (NCCL, MCCL, Gloo). One that only joins the ranks of its own
    // process (sim's) gets multi-process groups through StagedCommunicator, over the cpu's CCL.
    virtual bool SpansProcesses() const { return true; }
};

// A communicator for `device` whose collectives copy the buffers to the host, run `host` (a cpu communicator
// with the same ranks) on them and copy the results back, on the current stream of the device; the host waits
// for each. For devices whose CCL cannot span processes.
std::unique_ptr<Communicator> StagedCommunicator(std::shared_ptr<Communicator> host, Device device);

// The rendezvous store the cpu CCL's unique ids point at (infinitrain.distributed sets it).
void SetRendezvousStore(const std::string& host, int port);
std::pair<std::string, int> RendezvousStore();  // ("", 0) until set

using CclFactory = std::function<std::unique_ptr<CclBackend>()>;

// Raises std::runtime_error naming the device type when it has no CCL.
CclBackend& GetCcl(DeviceType type);
bool HasCcl(DeviceType type);
void RegisterCcl(DeviceType type, CclFactory factory, const char* site);

}  // namespace infinitrain
