// The cpu's CCL on Gloo (TCP transport): one process per rank, ranks meeting through the rendezvous store
// (infinitrain/store.h). Registered for the cpu device type when its module, infinitrain._gloo, loads.
//
// Collectives run on the calling thread and have finished on return (the cpu's stream is synchronous), one at a
// time per communicator, each with the next tag so ranks pair up their calls in issue order. Reductions run
// Gloo's algorithms over an accumulation buffer: float for float32/bfloat16/float16 (16-bit floats round once,
// at the end), double for float64, int64 for int32/int64 (sums and products wrap, an integer avg truncates
// toward zero), the same arithmetic as the sim provider's CCL. Reduce-scatter is an all-reduce of which each
// rank keeps its block. A send copies its payload and completes when its receiver takes it, so a ring of
// send-then-recv cannot deadlock; pending sends finish before the next collective and when the communicator
// goes away. Gloo's errors (a peer gone, a timeout: INFINITRAIN_CCL_TIMEOUT_S, default 300 s) become
// std::runtime_error naming the collective.
#include "infinitrain/gloo/gloo_ccl.h"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "infinitrain/ccl.h"
#include "infinitrain/ccl_host_math.h"
#include "infinitrain/dtype_dispatch.h"
#include "infinitrain/store.h"

namespace infinitrain::gloo_ccl {
namespace {

std::chrono::milliseconds Timeout() {
    const char* s = std::getenv("INFINITRAIN_CCL_TIMEOUT_S");
    double t = s ? std::atof(s) : 300.0;
    if (!(t > 0)) t = 300.0;
    return std::chrono::milliseconds(static_cast<int64_t>(t * 1000));
}

// Gloo's store interface over ours.
class StoreAdapter : public gloo::rendezvous::Store {
public:
    explicit StoreAdapter(std::shared_ptr<TcpStore> s) : s_(std::move(s)) {}
    void set(const std::string& key, const std::vector<char>& data) override {
        s_->Set(key, std::string(data.begin(), data.end()));
    }
    std::vector<char> get(const std::string& key) override {
        std::string v = s_->Get(key);
        return std::vector<char>(v.begin(), v.end());
    }
    void wait(const std::vector<std::string>& keys) override { s_->Wait(keys); }
    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
        s_->Wait(keys, timeout);
    }

private:
    std::shared_ptr<TcpStore> s_;
};

// The unique id: "gloo1", the store's host and port, and a random group prefix, '\n'-separated.
struct Id {
    std::string host, prefix;
    int port = 0;
};

CclUniqueId Encode(const Id& id) {
    std::string s = "gloo1\n" + id.host + "\n" + std::to_string(id.port) + "\n" + id.prefix + "\n";
    CclUniqueId out{};
    if (s.size() > out.size()) throw std::invalid_argument("gloo CCL: the store's host name is too long");
    std::memcpy(out.data(), s.data(), s.size());
    return out;
}

Id Decode(const CclUniqueId& raw) {
    std::string s(reinterpret_cast<const char*>(raw.data()), raw.size());
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t i = 0; i < s.size() && parts.size() < 4; ++i) {
        if (s[i] == '\n') {
            parts.push_back(s.substr(start, i - start));
            start = i + 1;
        }
    }
    if (parts.size() != 4 || parts[0] != "gloo1") {
        throw std::invalid_argument("gloo CCL: not a unique id from unique_id('cpu')");
    }
    return Id{parts[1], parts[3], std::atoi(parts[2].c_str())};
}

// The address of this host that reaches `host` (the route the kernel picks), for Gloo's listening socket.
std::string LocalAddressToward(const std::string& host, int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &a.sin_addr) != 1) return host;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return host;
    std::string out = host;
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
        sockaddr_in local{};
        socklen_t len = sizeof(local);
        char buf[INET_ADDRSTRLEN];
        if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
            inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf))) {
            out = buf;
        }
    }
    close(fd);
    return out;
}

// ---------------------------------------------------------------- arithmetic

using ccl_host::AccOf;
using ccl_host::CanReduce;
using ccl_host::Combine;

class GlooComm;

// The live communicators, so that FlushSends() can finish their sends before the process exits.
std::mutex live_mu;
std::set<GlooComm*> live;

class GlooComm final : public Communicator {
public:
    GlooComm(std::shared_ptr<gloo::rendezvous::Context> ctx, std::chrono::milliseconds timeout)
        : ctx_(std::move(ctx)), timeout_(timeout) {
        std::lock_guard<std::mutex> lock(live_mu);
        live.insert(this);
    }

    ~GlooComm() override {
        {
            std::lock_guard<std::mutex> lock(live_mu);
            live.erase(this);
        }
        Flush();
    }

    // Waits for this communicator's pending sends; a peer that never takes its message is given up on.
    void Flush() noexcept {
        try {
            std::lock_guard<std::mutex> lock(mu_);
            FinishSends();
        } catch (...) {
        }
    }

    int rank() const override { return ctx_->rank; }
    int size() const override { return ctx_->size; }
    Device device() const override { return Device{}; }

    void AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, const Stream&) override {
        Run("all_reduce", [&] { Reduced(send, recv, count, count, 0, dtype, op, -1); });
    }

    void Broadcast(const void* send, void* recv, size_t count, DataType dtype, int root, const Stream&) override {
        Run("broadcast", [&] {
            size_t n = count * DataTypeSize(dtype);
            if (rank() == root && send != recv && n) std::memmove(recv, send, n);
            gloo::BroadcastOptions o(ctx_);
            o.setOutput(static_cast<uint8_t*>(recv), n);
            o.setRoot(root);
            o.setTag(NextTag());
            o.setTimeout(timeout_);
            if (n) gloo::broadcast(o);
        });
    }

    void Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
                const Stream&) override {
        Run("reduce", [&] { Reduced(send, recv, count, count, 0, dtype, op, root); });
    }

    void AllGather(const void* send, void* recv, size_t count, DataType dtype, const Stream&) override {
        Run("all_gather", [&] {
            size_t n = count * DataTypeSize(dtype);
            if (!n) return;
            gloo::AllgatherOptions o(ctx_);
            o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), n);
            o.setOutput(static_cast<uint8_t*>(recv), n * size());
            o.setTag(NextTag());
            o.setTimeout(timeout_);
            gloo::allgather(o);
        });
    }

    void ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       const Stream&) override {
        Run("reduce_scatter",
            [&] { Reduced(send, recv, count * size(), count, count * static_cast<size_t>(rank()), dtype, op, -1); });
    }

    void Send(const void* buf, size_t count, DataType dtype, int peer, const Stream&) override {
        CheckPeer("send to", peer);
        Run("send", [&] {
            size_t n = count * DataTypeSize(dtype);
            auto copy =
                std::make_shared<std::vector<char>>(static_cast<const char*>(buf), static_cast<const char*>(buf) + n);
            auto ub = ctx_->createUnboundBuffer(copy->data(), copy->size());
            ub->send(peer, Slot(peer, send_seq_));
            sends_.push_back({std::move(ub), std::move(copy), peer});
        });
    }

    void Recv(void* buf, size_t count, DataType dtype, int peer, const Stream&) override {
        CheckPeer("recv from", peer);
        std::lock_guard<std::mutex> lock(mu_);
        try {
            size_t n = count * DataTypeSize(dtype);
            auto ub = ctx_->createUnboundBuffer(buf, n);
            ub->recv(peer, Slot(peer, recv_seq_, true));
            if (!ub->waitRecv(timeout_)) throw std::runtime_error("timed out");
            FinishSends();
        } catch (const std::exception& e) {
            throw std::runtime_error(std::string("gloo CCL recv from rank ") + std::to_string(peer) + ": " + e.what());
        }
    }

    std::string AsyncError() override { return ""; }  // collectives finish (or raise) before returning

private:
    struct PendingSend {
        std::unique_ptr<gloo::transport::UnboundBuffer> buf;
        std::shared_ptr<std::vector<char>> data;
        int peer;
    };

    // Gloo has no pair from a rank to itself (its loop thread would fault).
    void CheckPeer(const char* what, int peer) const {
        if (peer == rank()) {
            throw std::invalid_argument(std::string("gloo CCL: ") + what + " its own rank (" + std::to_string(peer) +
                                        "): use a copy");
        }
    }

    template <typename F>
    void Run(const char* what, F&& f) {
        std::lock_guard<std::mutex> lock(mu_);
        try {
            if (std::string(what) != "send") FinishSends();
            f();
        } catch (const std::invalid_argument&) {
            throw;
        } catch (const std::exception& e) {
            throw std::runtime_error(std::string("gloo CCL ") + what + " (rank " + std::to_string(rank()) + " of " +
                                     std::to_string(size()) + "): " + e.what());
        }
    }

    void FinishSends() {
        for (PendingSend& s : sends_) {
            if (!s.buf->waitSend(timeout_)) {
                throw std::runtime_error("a send to rank " + std::to_string(s.peer) + " was not received in time");
            }
        }
        sends_.clear();
    }

    uint32_t NextTag() { return tag_++; }

    // Send/recv pairs of (this rank, peer) match by a per-direction sequence number. The top byte keeps clear of
    // the prefixes Gloo's collectives use (1-8).
    uint64_t Slot(int peer, std::map<int, uint64_t>& seq, bool incoming = false) {
        int src = incoming ? peer : rank(), dst = incoming ? rank() : peer;
        uint64_t n = seq[peer]++ & 0xffffffffu;
        return (static_cast<uint64_t>(0x40) << 56) | (n << 24) | (static_cast<uint64_t>(src) << 12) |
               static_cast<uint64_t>(dst);
    }

    // A reduction over `total` elements of send; the result's elements [offset, offset + keep) go to recv (to
    // every rank, or only to root >= 0).
    void Reduced(const void* send, void* recv, size_t total, size_t keep, size_t offset, DataType dtype, ReduceOp op,
                 int root) {
        if (!CanReduce(dtype)) {
            throw std::invalid_argument(std::string("gloo CCL: cannot reduce ") + DataTypeName(dtype) +
                                        " (floats, int32 and int64 only)");
        }
        dispatch::DispatchNumeric(dtype, "gloo CCL", [&](auto tag) {
            using T = typename decltype(tag)::type;
            using A = AccOf<T>;
            const T* in = static_cast<const T*>(send);
            std::vector<A> acc(total);
            for (size_t i = 0; i < total; ++i) acc[i] = ccl_host::LoadAcc(in + i);
            auto fn = [op](void* c, const void* a, const void* b, size_t n) {
                A* out = static_cast<A*>(c);
                const A* x = static_cast<const A*>(a);
                const A* y = static_cast<const A*>(b);
                for (size_t i = 0; i < n; ++i) out[i] = Combine(x[i], y[i], op);
            };
            if (total) {
                if (root < 0) {
                    gloo::AllreduceOptions o(ctx_);
                    o.setOutput(acc.data(), total);
                    o.setReduceFunction(fn);
                    o.setTag(NextTag());
                    o.setTimeout(timeout_);
                    gloo::allreduce(o);
                } else {
                    std::vector<A> result(total);
                    gloo::ReduceOptions o(ctx_);
                    o.setInput(acc.data(), total);
                    o.setOutput(result.data(), total);
                    o.setRoot(root);
                    o.setReduceFunction(fn);
                    o.setTag(NextTag());
                    o.setTimeout(timeout_);
                    gloo::reduce(o);
                    acc.swap(result);
                }
            }
            if (root >= 0 && rank() != root) return;
            T* out = static_cast<T*>(recv);
            const A k = static_cast<A>(size());
            for (size_t i = 0; i < keep; ++i) {
                A v = acc[offset + i];
                if (op == ReduceOp::kAvg) v /= k;  // integers truncate toward zero
                ccl_host::StoreAcc(out + i, v);
            }
        });
    }

    std::shared_ptr<gloo::rendezvous::Context> ctx_;
    std::chrono::milliseconds timeout_;
    std::mutex mu_;
    uint32_t tag_ = 0;
    std::map<int, uint64_t> send_seq_, recv_seq_;
    std::vector<PendingSend> sends_;
};

class GlooCcl final : public CclBackend {
public:
    CclUniqueId GetUniqueId() override {
        auto [host, port] = RendezvousStore();
        if (host.empty()) {
            throw std::runtime_error(
                "gloo CCL: no rendezvous store: call infinitrain.distributed.init_process_group() first "
                "(it connects to MASTER_ADDR:MASTER_PORT, which infinitrain.run sets)");
        }
        std::random_device rd;
        char prefix[17];
        std::snprintf(prefix, sizeof(prefix), "%08x%08x", rd(), rd());
        return Encode(Id{host, prefix, port});
    }

    std::unique_ptr<Communicator> InitRank(const CclUniqueId& raw, int nranks, int rank, Device device) override {
        if (!device.is_cpu())
            throw std::invalid_argument("gloo CCL: communicators are for the cpu, got " + device.ToString());
        if (nranks < 1 || rank < 0 || rank >= nranks) {
            throw std::invalid_argument("gloo CCL: need 0 <= rank < nranks, got rank " + std::to_string(rank) + " of " +
                                        std::to_string(nranks));
        }
        Id id = Decode(raw);
        const std::chrono::milliseconds timeout = Timeout();
        try {
            auto store = std::make_shared<TcpStore>(id.host, id.port, false, timeout);
            StoreAdapter adapter(store);
            gloo::rendezvous::PrefixStore prefixed("gloo/" + id.prefix, adapter);
            gloo::transport::tcp::attr attr;
            if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME")) {
                attr.iface = iface;
            } else {
                attr.hostname = LocalAddressToward(id.host, id.port);
            }
            auto dev = gloo::transport::tcp::CreateDevice(attr);
            auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
            ctx->setTimeout(timeout);
            ctx->connectFullMesh(prefixed, dev);
            return std::make_unique<GlooComm>(std::move(ctx), timeout);
        } catch (const StoreTimeout& e) {
            throw StoreTimeout(std::string("gloo CCL: rank ") + std::to_string(rank) + " of " + std::to_string(nranks) +
                               " could not meet the others: " + e.what());
        } catch (const std::exception& e) {
            throw std::runtime_error(std::string("gloo CCL: rank ") + std::to_string(rank) + " of " +
                                     std::to_string(nranks) + " could not connect: " + e.what());
        }
    }

    std::vector<std::unique_ptr<Communicator>> InitAll(const std::vector<Device>&) override {
        throw std::invalid_argument("gloo CCL: one process per rank (init_rank), not init_all");
    }

    void GroupStart() override { ++depth_; }
    void GroupEnd() override {
        if (depth_ == 0) throw std::logic_error("gloo CCL: GroupEnd without a matching GroupStart");
        --depth_;
    }

private:
    static thread_local int depth_;
};

thread_local int GlooCcl::depth_ = 0;

}  // namespace

void FlushSends() {
    std::lock_guard<std::mutex> lock(live_mu);
    for (GlooComm* c : live) c->Flush();
}

namespace {

struct Registrar {
    Registrar() {
        RegisterCcl(
            DeviceType::kCPU, [] { return std::unique_ptr<CclBackend>(new GlooCcl()); }, __FILE__);
    }
} registrar;

}  // namespace
}  // namespace infinitrain::gloo_ccl
