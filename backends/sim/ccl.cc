// The sim provider's CCL: collectives across the sim devices of this process.
//
// Communicators made together (one InitAll call, or InitRank calls sharing a
// unique id) share a Group. A collective enqueues one task per rank on that
// rank's stream; the tasks meet at a rendezvous keyed by the group and the
// rank's collective sequence number (so collectives of different groups or
// streams never mix), check that all ranks agree on the call, each compute
// their own output into scratch from the host views of every rank's buffers,
// wait until every rank finished reading (so in-place calls are safe), then
// write their output. Send is buffered (the payload is copied at send time)
// so a send never waits for its receiver: a ring of send-then-recv on one
// stream per device cannot deadlock. Send/recv pairs match by (src, dst,
// per-pair sequence number).
//
// Every stream has its own worker thread and enqueueing never blocks the
// host, so calls issued between GroupStart and GroupEnd from one host thread
// need no fusing; the group calls only track nesting.
//
// Reductions: sum, avg, max, min, prod over float32, float64, float16 and
// bfloat16 (16-bit floats accumulate in float32 and round once), int32 and
// int64 (sum and prod wrap; integer avg truncates toward zero). Data movement
// (broadcast, all-gather, send/recv) takes any dtype.
//
// Errors found inside a task (ranks disagreeing on a call, timeouts) are
// thrown from the task, so they become the device's asynchronous error, and
// are kept per rank for AsyncError(). As with NCCL, a communicator that
// reported an error should be discarded. The wait limit is 60 s, or
// INFINITRAIN_SIM_CCL_TIMEOUT_S read when the group is created.

#include "infinitrain/ccl.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/sim/sim.h"
#include "infinitrain/ccl_host_math.h"
#include "infinitrain/dtype_dispatch.h"
#include "infinitrain/provider.h"

namespace infinitrain::sim {
namespace {

using Clock = std::chrono::steady_clock;

enum class Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter };

const char* KindName(Kind k) {
    switch (k) {
        case Kind::kAllReduce:
            return "all_reduce";
        case Kind::kBroadcast:
            return "broadcast";
        case Kind::kReduce:
            return "reduce";
        case Kind::kAllGather:
            return "all_gather";
        case Kind::kReduceScatter:
            return "reduce_scatter";
    }
    return "?";
}

const char* OpName(ReduceOp op) {
    switch (op) {
        case ReduceOp::kSum:
            return "sum";
        case ReduceOp::kAvg:
            return "avg";
        case ReduceOp::kMax:
            return "max";
        case ReduceOp::kMin:
            return "min";
        case ReduceOp::kProd:
            return "prod";
    }
    return "?";
}

bool Reduces(Kind k) { return k == Kind::kAllReduce || k == Kind::kReduce || k == Kind::kReduceScatter; }
bool HasRoot(Kind k) { return k == Kind::kBroadcast || k == Kind::kReduce; }

double TimeoutSeconds() {
    const char* s = std::getenv("INFINITRAIN_SIM_CCL_TIMEOUT_S");
    if (s == nullptr || *s == '\0') return 60.0;
    char* end = nullptr;
    double v = std::strtod(s, &end);
    if (end == s || *end != '\0' || !(v > 0)) {
        throw std::invalid_argument(
            std::string("INFINITRAIN_SIM_CCL_TIMEOUT_S must be a positive number of seconds, got '") + s + "'");
    }
    return v;
}

std::string Seconds(double s) {
    std::string t = std::to_string(s);
    t.erase(t.find_last_not_of('0') + 1);
    if (!t.empty() && t.back() == '.') t.pop_back();
    return t + " s";
}

// ---------------------------------------------------------------- reductions

using ccl_host::CanReduce;
using ccl_host::LoadAcc;
using ccl_host::StoreAcc;

// out[i] = op over r of ins[r][i], i < n. out may not alias any input.
template <typename T>
void ReduceTyped(void* out, const std::vector<const void*>& ins, size_t n, ReduceOp op) {
    using A = ccl_host::AccOf<T>;
    std::vector<A> acc(n);
    const T* first = static_cast<const T*>(ins[0]);
    for (size_t i = 0; i < n; ++i) acc[i] = LoadAcc(first + i);
    for (size_t r = 1; r < ins.size(); ++r) {
        const T* in = static_cast<const T*>(ins[r]);
        for (size_t i = 0; i < n; ++i) acc[i] = ccl_host::Combine(acc[i], LoadAcc(in + i), op);
    }
    if (op == ReduceOp::kAvg) {
        A k = static_cast<A>(ins.size());
        for (size_t i = 0; i < n; ++i) acc[i] /= k;  // integers truncate toward zero
    }
    T* o = static_cast<T*>(out);
    for (size_t i = 0; i < n; ++i) StoreAcc(o + i, acc[i]);
}

void Reduce(void* out, const std::vector<const void*>& ins, size_t n, DataType t, ReduceOp op) {
    dispatch::DispatchNumeric(t, "sim CCL reduction",
                              [&](auto tag) { ReduceTyped<typename decltype(tag)::type>(out, ins, n, op); });
}

// ---------------------------------------------------------------- groups

// One rank's part of one collective; buffers are host views.
struct Call {
    Kind kind;
    size_t count;
    DataType dtype;
    ReduceOp op;
    int root;
    const uint8_t* send;
    uint8_t* recv;
};

struct Rendezvous {
    std::vector<Call> calls;
    std::vector<bool> present;
    int arrived = 0;
    int done_reading = 0;
    int left = 0;
    std::string error;  // set once the collective failed; every rank throws it
};

struct Message {
    size_t count;
    DataType dtype;
    std::vector<uint8_t> data;
};

struct Group {
    Group(std::vector<Device> devs, double timeout_s)
        : devices(std::move(devs)), size(static_cast<int>(devices.size())), timeout_s(timeout_s), errors(size) {}

    Clock::time_point Deadline() const {
        return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    }

    // Keeps the first error of each rank.
    void SetError(int rank, const std::string& msg) {
        if (errors[rank].empty()) errors[rank] = msg;
    }

    const std::vector<Device> devices;
    const int size;
    const double timeout_s;

    std::mutex mu;
    std::condition_variable cv;
    std::map<uint64_t, Rendezvous> slots;                             // by collective sequence number
    std::map<std::pair<int, int>, std::map<uint64_t, Message>> mail;  // (src, dst) -> send sequence -> payload
    std::vector<std::string> errors;                                  // per rank, for AsyncError()
};

std::string Describe(const Call& c) {
    std::string s =
        std::string(KindName(c.kind)) + "(count=" + std::to_string(c.count) + ", dtype=" + DataTypeName(c.dtype);
    if (Reduces(c.kind)) s += std::string(", op=") + OpName(c.op);
    if (HasRoot(c.kind)) s += ", root=" + std::to_string(c.root);
    return s + ")";
}

bool SameCall(const Call& a, const Call& b) {
    return a.kind == b.kind && a.count == b.count && a.dtype == b.dtype && (!Reduces(a.kind) || a.op == b.op) &&
           (!HasRoot(a.kind) || a.root == b.root);
}

std::string Missing(const std::vector<bool>& present) {
    std::string s;
    for (size_t r = 0; r < present.size(); ++r) {
        if (!present[r]) s += (s.empty() ? "" : ", ") + std::to_string(r);
    }
    return s;
}

// rank's output of collective `all` (all ranks' calls) into scratch; reads every rank's inputs.
void Compute(const std::vector<Call>& all, int rank, std::vector<uint8_t>& scratch) {
    const Call& me = all[rank];
    const size_t esize = DataTypeSize(me.dtype);
    const size_t bytes = me.count * esize;
    const int size = static_cast<int>(all.size());
    switch (me.kind) {
        case Kind::kAllReduce:
        case Kind::kReduce: {
            if (me.kind == Kind::kReduce && rank != me.root) return;
            std::vector<const void*> ins;
            for (const Call& c : all) ins.push_back(c.send);
            scratch.resize(bytes);
            if (bytes) Reduce(scratch.data(), ins, me.count, me.dtype, me.op);
            return;
        }
        case Kind::kBroadcast:
            scratch.resize(bytes);
            if (bytes) std::memcpy(scratch.data(), all[me.root].send, bytes);
            return;
        case Kind::kAllGather:
            scratch.resize(bytes * size);
            if (bytes) {
                for (int r = 0; r < size; ++r) std::memcpy(scratch.data() + r * bytes, all[r].send, bytes);
            }
            return;
        case Kind::kReduceScatter: {
            std::vector<const void*> ins;
            for (const Call& c : all) ins.push_back(c.send + rank * bytes);
            scratch.resize(bytes);
            if (bytes) Reduce(scratch.data(), ins, me.count, me.dtype, me.op);
            return;
        }
    }
}

// Runs on rank's stream: the whole rendezvous for collective `seq`.
void RunCollective(Group& g, int rank, uint64_t seq, const Call& call) {
    const auto deadline = g.Deadline();
    const std::string what = "sim CCL: " + std::string(KindName(call.kind)) + " #" + std::to_string(seq) + " on rank " +
                             std::to_string(rank);
    std::unique_lock<std::mutex> lock(g.mu);
    Rendezvous& s = g.slots[seq];
    auto leave = [&] {
        if (++s.left == g.size) g.slots.erase(seq);
    };
    auto fail = [&](const std::string& msg) {
        if (s.error.empty()) s.error = msg;
        g.SetError(rank, s.error);
        g.cv.notify_all();
        std::string err = s.error;
        leave();
        throw std::runtime_error(err);
    };
    if (s.calls.empty()) {
        s.calls.resize(g.size);
        s.present.assign(g.size, false);
    }
    s.calls[rank] = call;
    s.present[rank] = true;
    ++s.arrived;
    g.cv.notify_all();
    if (!g.cv.wait_until(lock, deadline, [&] { return s.arrived == g.size || !s.error.empty(); })) {
        fail(what + " timed out after " + Seconds(g.timeout_s) + " waiting for rank(s) " + Missing(s.present) +
             " (every rank must issue the same collectives in the same order)");
    }
    if (!s.error.empty()) fail(s.error);
    for (int r = 0; r < g.size; ++r) {
        if (!SameCall(s.calls[r], s.calls[0])) {
            fail("sim CCL: ranks disagree on collective #" + std::to_string(seq) + ": rank 0 called " +
                 Describe(s.calls[0]) + ", rank " + std::to_string(r) + " called " + Describe(s.calls[r]));
        }
    }

    // Phase 1: read every rank's inputs into our scratch, without the lock.
    std::vector<uint8_t> scratch;
    std::string compute_error;
    lock.unlock();
    try {
        Compute(s.calls, rank, scratch);
    } catch (const std::exception& e) {
        compute_error = what + ": " + e.what();
    }
    lock.lock();
    if (!compute_error.empty() && s.error.empty()) s.error = compute_error;
    ++s.done_reading;
    g.cv.notify_all();
    // Phase 2: once nobody reads inputs any more, overwrite our output (it may be our input).
    if (!g.cv.wait_until(lock, deadline, [&] { return s.done_reading == g.size; })) {
        fail(what + " timed out after " + Seconds(g.timeout_s) + " waiting for the other ranks to finish reading");
    }
    if (!s.error.empty()) fail(s.error);
    lock.unlock();
    if (!scratch.empty()) std::memcpy(call.recv, scratch.data(), scratch.size());
    lock.lock();
    leave();
}

// ---------------------------------------------------------------- communicator

void* View(const void* p, size_t bytes) { return bytes == 0 ? nullptr : HostView(p); }

class SimComm : public Communicator {
public:
    SimComm(std::shared_ptr<Group> g, int rank)
        : g_(std::move(g)), rank_(rank), send_seq_(g_->size, 0), recv_seq_(g_->size, 0) {}

    int rank() const override { return rank_; }
    int size() const override { return g_->size; }
    Device device() const override { return g_->devices[rank_]; }

    void AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                   const Stream& stream) override {
        Collective(Kind::kAllReduce, send, count, recv, count, count, dtype, op, 0, stream);
    }
    void Broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                   const Stream& stream) override {
        CheckRank(root, "root");
        // Only the root's send buffer is read.
        Collective(Kind::kBroadcast, send, rank_ == root ? count : 0, recv, count, count, dtype, ReduceOp::kSum, root,
                   stream);
    }
    void Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
                const Stream& stream) override {
        CheckRank(root, "root");
        // Only the root's receive buffer is written.
        Collective(Kind::kReduce, send, count, recv, rank_ == root ? count : 0, count, dtype, op, root, stream);
    }
    void AllGather(const void* send, void* recv, size_t count, DataType dtype, const Stream& stream) override {
        Collective(Kind::kAllGather, send, count, recv, count * g_->size, count, dtype, ReduceOp::kSum, 0, stream);
    }
    void ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       const Stream& stream) override {
        Collective(Kind::kReduceScatter, send, count * g_->size, recv, count, count, dtype, op, 0, stream);
    }

    void Send(const void* buf, size_t count, DataType dtype, int peer, const Stream& stream) override {
        CheckRank(peer, "peer");
        const size_t bytes = count * DataTypeSize(dtype);
        const uint8_t* src = static_cast<const uint8_t*>(View(buf, bytes));
        uint64_t seq = Next(send_seq_, peer);
        std::shared_ptr<Group> g = g_;
        int me = rank_;
        Enqueue(stream, [g, me, peer, seq, src, count, dtype, bytes] {
            Message m{count, dtype, std::vector<uint8_t>(src, src + bytes)};
            std::lock_guard<std::mutex> lock(g->mu);
            g->mail[{me, peer}].emplace(seq, std::move(m));
            g->cv.notify_all();
        });
    }

    void Recv(void* buf, size_t count, DataType dtype, int peer, const Stream& stream) override {
        CheckRank(peer, "peer");
        const size_t bytes = count * DataTypeSize(dtype);
        uint8_t* dst = static_cast<uint8_t*>(View(buf, bytes));
        uint64_t seq = Next(recv_seq_, peer);
        std::shared_ptr<Group> g = g_;
        int me = rank_;
        Enqueue(stream, [g, me, peer, seq, dst, count, dtype, bytes] {
            const std::string what = "sim CCL: recv #" + std::to_string(seq) + " on rank " + std::to_string(me) +
                                     " from rank " + std::to_string(peer);
            std::unique_lock<std::mutex> lock(g->mu);
            auto& box = g->mail[{peer, me}];
            if (!g->cv.wait_until(lock, g->Deadline(), [&] { return box.count(seq) > 0; })) {
                std::string msg = what + " timed out after " + Seconds(g->timeout_s) + ": no matching send";
                g->SetError(me, msg);
                throw std::runtime_error(msg);
            }
            Message m = std::move(box.at(seq));
            box.erase(seq);
            if (m.count != count || m.dtype != dtype) {
                std::string msg = what + ": expected " + std::to_string(count) + " " + DataTypeName(dtype) +
                                  " elements, the send has " + std::to_string(m.count) + " " + DataTypeName(m.dtype);
                g->SetError(me, msg);
                g->SetError(peer, msg);  // the sender's task already finished: tell its communicator
                throw std::runtime_error(msg);
            }
            lock.unlock();
            if (bytes) std::memcpy(dst, m.data.data(), bytes);
        });
    }

    std::string AsyncError() override {
        std::lock_guard<std::mutex> lock(g_->mu);
        return g_->errors[rank_];
    }

private:
    void CheckRank(int r, const char* what) const {
        if (r < 0 || r >= g_->size) {
            throw std::invalid_argument(std::string("sim CCL: ") + what + " " + std::to_string(r) +
                                        " out of range for a group of " + std::to_string(g_->size));
        }
    }

    uint64_t Next(std::vector<uint64_t>& seqs, int peer) {
        std::lock_guard<std::mutex> lock(mu_);
        return seqs[peer]++;
    }

    // send_count/recv_count: elements of each buffer this rank touches (0: unused, may be null).
    void Collective(Kind kind, const void* send, size_t send_count, void* recv, size_t recv_count, size_t count,
                    DataType dtype, ReduceOp op, int root, const Stream& stream) {
        if (Reduces(kind) && !CanReduce(dtype)) {
            throw std::invalid_argument(std::string("sim CCL: ") + KindName(kind) + " cannot reduce " +
                                        DataTypeName(dtype) +
                                        ": expected float32, float64, bfloat16, float16, int32 or int64");
        }
        const size_t esize = DataTypeSize(dtype);
        Call call{kind,
                  count,
                  dtype,
                  op,
                  root,
                  static_cast<const uint8_t*>(View(send, send_count * esize)),
                  static_cast<uint8_t*>(View(recv, recv_count * esize))};
        uint64_t seq;
        {
            std::lock_guard<std::mutex> lock(mu_);
            seq = coll_seq_++;
        }
        std::shared_ptr<Group> g = g_;
        int me = rank_;
        Enqueue(stream, [g, me, seq, call] { RunCollective(*g, me, seq, call); });
    }

    std::shared_ptr<Group> g_;
    const int rank_;
    std::mutex mu_;  // the sequence counters: a communicator may be used from several threads
    uint64_t coll_seq_ = 0;
    std::vector<uint64_t> send_seq_;  // per peer
    std::vector<uint64_t> recv_seq_;  // per peer
};

// ---------------------------------------------------------------- backend

void CheckSimDevice(const Device& d) {
    if (d.type != DeviceType::kPrivateUse1) {
        throw std::invalid_argument("sim CCL: expected a sim device, got " + d.ToString());
    }
    if (d.index < 0 || d.index >= DeviceCount()) {
        throw std::invalid_argument("sim CCL: device " + d.ToString() + " does not exist (" +
                                    std::to_string(DeviceCount()) + " sim devices)");
    }
}

// Ranks of one group on one device would wait for each other on one worker thread.
void CheckDistinct(const std::vector<Device>& devs, const std::vector<bool>& present) {
    for (size_t i = 0; i < devs.size(); ++i) {
        for (size_t j = i + 1; j < devs.size(); ++j) {
            if (present[i] && present[j] && devs[i] == devs[j]) {
                throw std::invalid_argument("sim CCL: ranks " + std::to_string(i) + " and " + std::to_string(j) +
                                            " are both on " + devs[i].ToString() +
                                            "; a group needs one device per rank");
            }
        }
    }
}

class SimCcl : public CclBackend {
public:
    CclUniqueId GetUniqueId() override {
        std::random_device rd;
        CclUniqueId id;
        for (size_t i = 0; i < id.size(); i += 4) {
            uint32_t v = rd();
            std::memcpy(id.data() + i, &v, std::min<size_t>(4, id.size() - i));
        }
        return id;
    }

    std::unique_ptr<Communicator> InitRank(const CclUniqueId& id, int nranks, int rank, Device device) override {
        if (nranks < 1 || rank < 0 || rank >= nranks) {
            throw std::invalid_argument("sim CCL: need 0 <= rank < nranks, got rank " + std::to_string(rank) + " of " +
                                        std::to_string(nranks));
        }
        CheckSimDevice(device);
        const double timeout_s = TimeoutSeconds();
        std::unique_lock<std::mutex> lock(mu_);
        auto it = pending_.find(id);
        if (it == pending_.end()) {
            it = pending_.emplace(id, Pending{}).first;
            it->second.devices.resize(nranks);
            it->second.present.assign(nranks, false);
        }
        Pending& p = it->second;
        const int want = static_cast<int>(p.devices.size());
        if (want != nranks) {
            throw std::invalid_argument("sim CCL: this unique id names a group of " + std::to_string(want) +
                                        " ranks, InitRank says " + std::to_string(nranks));
        }
        if (p.present[rank]) {
            throw std::invalid_argument("sim CCL: rank " + std::to_string(rank) + " already joined this group");
        }
        p.devices[rank] = device;
        p.present[rank] = true;
        try {
            CheckDistinct(p.devices, p.present);
        } catch (...) {
            p.present[rank] = false;
            if (std::none_of(p.present.begin(), p.present.end(), [](bool b) { return b; })) pending_.erase(it);
            throw;
        }
        if (++p.joined == nranks) {
            p.group = std::make_shared<Group>(p.devices, timeout_s);
            cv_.notify_all();
        } else {
            auto deadline =
                Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
            if (!cv_.wait_until(lock, deadline, [&] { return p.group != nullptr; })) {
                std::string missing = Missing(p.present);
                p.present[rank] = false;
                if (--p.joined == 0) pending_.erase(it);
                throw std::runtime_error("sim CCL: InitRank(rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks) + ") timed out after " + Seconds(timeout_s) +
                                         " waiting for rank(s) " + missing + " to join");
            }
        }
        std::shared_ptr<Group> g = p.group;
        if (++p.taken == nranks) pending_.erase(it);  // every rank has it: the id may be reused
        return std::make_unique<SimComm>(std::move(g), rank);
    }

    std::vector<std::unique_ptr<Communicator>> InitAll(const std::vector<Device>& devices) override {
        if (devices.empty()) throw std::invalid_argument("sim CCL: InitAll needs at least one device");
        for (const Device& d : devices) CheckSimDevice(d);
        CheckDistinct(devices, std::vector<bool>(devices.size(), true));
        auto g = std::make_shared<Group>(devices, TimeoutSeconds());
        std::vector<std::unique_ptr<Communicator>> comms;
        for (int r = 0; r < static_cast<int>(devices.size()); ++r) comms.push_back(std::make_unique<SimComm>(g, r));
        return comms;
    }

    // Nothing to fuse (see the top of this file): only nesting is tracked, per host thread.
    void GroupStart() override { ++GroupDepth(); }
    void GroupEnd() override {
        if (GroupDepth() == 0) throw std::logic_error("sim CCL: GroupEnd without a matching GroupStart");
        --GroupDepth();
    }
    // Groups meet in this process's memory; across processes the core stages through the cpu's CCL.
    bool SpansProcesses() const override { return false; }

private:
    static int& GroupDepth() {
        thread_local int depth = 0;
        return depth;
    }

    struct Pending {
        std::vector<Device> devices;
        std::vector<bool> present;
        int joined = 0;
        int taken = 0;
        std::shared_ptr<Group> group;
    };

    std::mutex mu_;
    std::condition_variable cv_;
    std::map<CclUniqueId, Pending> pending_;
};

}  // namespace

REGISTER_PROVIDER_CCL(kName, SimCcl);

}  // namespace infinitrain::sim
