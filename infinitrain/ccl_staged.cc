// Collectives of a device staged through host memory and the cpu's CCL (StagedCommunicator in ccl.h), and the
// address of the rendezvous store.
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "infinitrain/ccl.h"
#include "infinitrain/dtype.h"
#include "infinitrain/runtime.h"

namespace infinitrain {
namespace {

class Staged final : public Communicator {
public:
    Staged(std::shared_ptr<Communicator> host, Device device) : host_(std::move(host)), device_(device) {
        if (host_->device().type != DeviceType::kCPU)
            throw std::invalid_argument("staged CCL: the host CCL must be cpu's");
    }

    int rank() const override { return host_->rank(); }
    int size() const override { return host_->size(); }
    Device device() const override { return device_; }

    void AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                   const Stream& stream) override {
        std::vector<char> h = Down(send, count, dtype, stream);
        host_->AllReduce(h.data(), h.data(), count, dtype, op, Stream());
        Up(h, recv, stream);
    }

    void Broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                   const Stream& stream) override {
        std::vector<char> h = rank() == root ? Down(send, count, dtype, stream) : Buffer(count, dtype);
        host_->Broadcast(h.data(), h.data(), count, dtype, root, Stream());
        Up(h, recv, stream);
    }

    void Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
                const Stream& stream) override {
        std::vector<char> h = Down(send, count, dtype, stream);
        host_->Reduce(h.data(), h.data(), count, dtype, op, root, Stream());
        if (rank() == root) Up(h, recv, stream);
    }

    void AllGather(const void* send, void* recv, size_t count, DataType dtype, const Stream& stream) override {
        std::vector<char> in = Down(send, count, dtype, stream), out = Buffer(count * size(), dtype);
        host_->AllGather(in.data(), out.data(), count, dtype, Stream());
        Up(out, recv, stream);
    }

    void ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       const Stream& stream) override {
        std::vector<char> in = Down(send, count * size(), dtype, stream), out = Buffer(count, dtype);
        host_->ReduceScatter(in.data(), out.data(), count, dtype, op, Stream());
        Up(out, recv, stream);
    }

    void Send(const void* buf, size_t count, DataType dtype, int peer, const Stream& stream) override {
        std::vector<char> h = Down(buf, count, dtype, stream);
        host_->Send(h.data(), count, dtype, peer, Stream());
    }

    void Recv(void* buf, size_t count, DataType dtype, int peer, const Stream& stream) override {
        std::vector<char> h = Buffer(count, dtype);
        host_->Recv(h.data(), count, dtype, peer, Stream());
        Up(h, buf, stream);
    }

    std::string AsyncError() override { return host_->AsyncError(); }

private:
    static std::vector<char> Buffer(size_t count, DataType dtype) {
        return std::vector<char>(count * DataTypeSize(dtype));
    }

    // The device's bytes on the host, once the work queued before them on `stream` ran.
    std::vector<char> Down(const void* src, size_t count, DataType dtype, const Stream& stream) {
        std::vector<char> h = Buffer(count, dtype);
        if (!h.empty()) {
            DeviceRuntime& rt = GetRuntime(device_.type);
            rt.MemcpyAsync(h.data(), src, h.size(), MemcpyKind::kDeviceToHost, stream);
            rt.SynchronizeStream(stream);
        }
        return h;
    }

    void Up(const std::vector<char>& h, void* dst, const Stream& stream) {
        if (h.empty()) return;
        DeviceRuntime& rt = GetRuntime(device_.type);
        rt.MemcpyAsync(dst, h.data(), h.size(), MemcpyKind::kHostToDevice, stream);
        rt.SynchronizeStream(stream);  // h is freed on return
    }

    std::shared_ptr<Communicator> host_;
    Device device_;
};

std::mutex store_mu;
std::string store_host;
int store_port = 0;

}  // namespace

std::unique_ptr<Communicator> StagedCommunicator(std::shared_ptr<Communicator> host, Device device) {
    if (!host) throw std::invalid_argument("staged CCL: no host communicator");
    return std::make_unique<Staged>(std::move(host), device);
}

void SetRendezvousStore(const std::string& host, int port) {
    std::lock_guard<std::mutex> lock(store_mu);
    store_host = host;
    store_port = port;
}

std::pair<std::string, int> RendezvousStore() {
    std::lock_guard<std::mutex> lock(store_mu);
    return {store_host, store_port};
}

}  // namespace infinitrain
