// Collectives on the device type's CCL: communicators (one process many devices, or one device per
// process with a unique id), the collectives themselves and group calls.
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>

#include "infinitrain/ccl.h"
#include "infinitrain/runtime.h"
#include "infinitrain/tensor.h"
#include "python/csrc/bindings.h"

namespace infinitrain::python {
namespace {

struct CommHandle {
    std::shared_ptr<Communicator> comm;  // shared: a staged communicator holds the cpu one it runs on
};

// Inside a group a CCL may enqueue the calls only at GroupEnd (NCCL does), so the buffers of the calls made
// since GroupStart are kept alive until then: freed earlier, their memory could be handed to work enqueued
// before the deferred collectives.
thread_local int t_group_depth = 0;
thread_local std::vector<std::shared_ptr<Storage>> t_group_buffers;

// Collective buffers: on the communicator's device, one dtype, the element counts the collective
// needs. Returns the stream the collective runs on, with every buffer marked as used there.
Stream Prepare(const CommHandle& c, const std::vector<Tensor>& ts, int64_t want, int64_t got) {
    for (const Tensor& t : ts) {
        if (t.device() != c.comm->device()) {
            throw std::invalid_argument("collective buffer on " + t.device().ToString() + ", communicator on " +
                                        c.comm->device().ToString());
        }
        if (t.dtype() != ts[0].dtype()) throw std::invalid_argument("collective buffers must share one dtype");
    }
    if (want != got) {
        throw std::invalid_argument("collective buffer sizes do not match: expected " + std::to_string(want) +
                                    " elements, got " + std::to_string(got));
    }
    Stream stream = CurrentStream(c.comm->device());
    for (const Tensor& t : ts) {
        t.storage()->RecordStream(stream);
        if (t_group_depth > 0) t_group_buffers.push_back(t.storage());
    }
    return stream;
}

void CheckRoot(const CommHandle& c, int r) {
    if (r < 0 || r >= c.comm->size()) {
        throw std::invalid_argument("rank " + std::to_string(r) + " out of range for a group of " +
                                    std::to_string(c.comm->size()));
    }
}

}  // namespace

void BindCollectives(py::module_& m) {
    py::class_<CommHandle, std::shared_ptr<CommHandle>>(m, "Communicator")
        .def_property_readonly("rank", [](const CommHandle& c) { return c.comm->rank(); })
        .def_property_readonly("size", [](const CommHandle& c) { return c.comm->size(); })
        .def_property_readonly("device", [](const CommHandle& c) { return c.comm->device().ToString(); })
        .def("async_error", [](const CommHandle& c) { return c.comm->AsyncError(); })
        .def("all_reduce",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv, const std::string& op) {
                 Stream s = Prepare(c, {send, recv}, send.numel(), recv.numel());
                 py::gil_scoped_release release;  // Gloo's collectives block until done
                 DeviceGuard guard(s.device());
                 c.comm->AllReduce(send.data(), recv.data(), send.numel(), send.dtype(), ParseReduceOp(op), s);
             })
        .def("broadcast",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv, int root) {
                 Stream s = Prepare(c, {send, recv}, send.numel(), recv.numel());
                 CheckRoot(c, root);
                 py::gil_scoped_release release;  // Gloo's collectives block until done
                 DeviceGuard guard(s.device());
                 c.comm->Broadcast(send.data(), recv.data(), send.numel(), send.dtype(), root, s);
             })
        .def("reduce",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv, const std::string& op, int root) {
                 Stream s = Prepare(c, {send, recv}, send.numel(), recv.numel());
                 CheckRoot(c, root);
                 py::gil_scoped_release release;  // Gloo's collectives block until done
                 DeviceGuard guard(s.device());
                 c.comm->Reduce(send.data(), recv.data(), send.numel(), send.dtype(), ParseReduceOp(op), root, s);
             })
        .def("all_gather",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv) {
                 Stream s = Prepare(c, {send, recv}, send.numel() * c.comm->size(), recv.numel());
                 py::gil_scoped_release release;  // Gloo's collectives block until done
                 DeviceGuard guard(s.device());
                 c.comm->AllGather(send.data(), recv.data(), send.numel(), send.dtype(), s);
             })
        .def("reduce_scatter",
             [](const CommHandle& c, const Tensor& send, const Tensor& recv, const std::string& op) {
                 Stream s = Prepare(c, {send, recv}, send.numel(), recv.numel() * c.comm->size());
                 py::gil_scoped_release release;  // Gloo's collectives block until done
                 DeviceGuard guard(s.device());
                 c.comm->ReduceScatter(send.data(), recv.data(), recv.numel(), send.dtype(), ParseReduceOp(op), s);
             })
        .def("send",
             [](const CommHandle& c, const Tensor& buf, int peer) {
                 Stream s = Prepare(c, {buf}, 0, 0);
                 CheckRoot(c, peer);
                 py::gil_scoped_release release;  // Gloo's collectives block until done
                 DeviceGuard guard(s.device());
                 c.comm->Send(buf.data(), buf.numel(), buf.dtype(), peer, s);
             })
        .def("recv", [](const CommHandle& c, const Tensor& buf, int peer) {
            Stream s = Prepare(c, {buf}, 0, 0);
            CheckRoot(c, peer);
            py::gil_scoped_release release;  // Gloo's collectives block until done
            DeviceGuard guard(s.device());
            c.comm->Recv(buf.data(), buf.numel(), buf.dtype(), peer, s);
        });
    m.def("ccl_init_all", [](const std::vector<std::string>& devs) {
        if (devs.empty()) throw std::invalid_argument("ccl_init_all: expected at least one device");
        std::vector<Device> ds;
        for (const std::string& s : devs) ds.push_back(Dev(s));
        for (const Device& d : ds) {
            if (d.type != ds[0].type) throw std::invalid_argument("ccl_init_all: devices must share one type");
            CheckDevice(d);
        }
        std::vector<std::unique_ptr<Communicator>> comms;
        {
            py::gil_scoped_release release;
            comms = GetCcl(ds[0].type).InitAll(ds);
        }
        py::list out;
        for (auto& c : comms) out.append(std::make_shared<CommHandle>(CommHandle{std::move(c)}));
        return out;
    });
    m.def("ccl_unique_id", [](const std::string& type) {
        CclUniqueId id = GetCcl(Dev(type).type).GetUniqueId();
        return py::bytes(reinterpret_cast<const char*>(id.data()), id.size());
    });
    m.def("ccl_init_rank", [](const py::bytes& id, int nranks, int rank, const std::string& dev) {
        std::string raw = id;
        CclUniqueId uid{};
        if (raw.size() != uid.size()) throw std::invalid_argument("ccl_init_rank: unique id must be 128 bytes");
        std::copy(raw.begin(), raw.end(), uid.begin());
        if (nranks < 1 || rank < 0 || rank >= nranks) {
            throw std::invalid_argument("ccl_init_rank: need 0 <= rank < nranks");
        }
        Device d = Dev(dev);
        CheckDevice(d);
        std::unique_ptr<Communicator> comm;
        {
            py::gil_scoped_release release;
            DeviceGuard guard(d);
            comm = GetCcl(d.type).InitRank(uid, nranks, rank, d);
        }
        return std::make_shared<CommHandle>(CommHandle{std::move(comm)});
    });
    m.def("ccl_group_start", [](const std::string& type) {
        GetCcl(Dev(type).type).GroupStart();
        t_group_depth += 1;
    });
    m.def("ccl_group_end", [](const std::string& type) {
        CclBackend& ccl = GetCcl(Dev(type).type);
        t_group_depth = std::max(0, t_group_depth - 1);
        {
            py::gil_scoped_release release;
            ccl.GroupEnd();
        }
        if (t_group_depth == 0) t_group_buffers.clear();  // the collectives are enqueued now
    });
    m.def("has_ccl", [](const std::string& type) { return HasCcl(Dev(type).type); });
    m.def("ccl_spans_processes", [](const std::string& type) { return GetCcl(Dev(type).type).SpansProcesses(); });
    m.def("ccl_staged", [](const CommHandle& host, const std::string& dev) {
        Device d = Dev(dev);
        CheckDevice(d);
        if (host.comm->device().type != DeviceType::kCPU) {
            throw std::invalid_argument("ccl_staged: the host communicator must be a cpu one, got " +
                                        host.comm->device().ToString());
        }
        return std::make_shared<CommHandle>(CommHandle{StagedCommunicator(host.comm, d)});
    });
    m.def("set_rendezvous_store", &SetRendezvousStore);
}

}  // namespace infinitrain::python
