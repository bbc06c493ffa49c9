#include "infinitrain/profiler.h"

#include <chrono>
#include <map>
#include <mutex>

#include "infinitrain/op.h"
#include "infinitrain/runtime.h"

namespace infinitrain {

namespace profiler_detail {
std::atomic<bool> g_active{false};
}

namespace {

using Clock = std::chrono::steady_clock;

struct Record {
    const Op* op;
    Device device;
    double host_start_us, host_us;
    Event start, end;
};

struct State {
    std::mutex mu;
    Clock::time_point t0;
    std::vector<Record> records;
    std::map<std::pair<int, int>, std::vector<Event>> spare;  // events to reuse, per device
};

State& Get() {
    static State* s = new State();
    return *s;
}

double SinceStartUs(Clock::time_point t) { return std::chrono::duration<double, std::micro>(t - Get().t0).count(); }

Event TakeEvent(const Device& d) {
    State& s = Get();
    {
        std::lock_guard<std::mutex> lock(s.mu);
        auto& v = s.spare[{static_cast<int>(d.type), d.index}];
        if (!v.empty()) {
            Event e = v.back();
            v.pop_back();
            return e;
        }
    }
    return GetRuntime(d.type).CreateEvent(d.index);
}

}  // namespace

void StartProfiling() {
    State& s = Get();
    std::lock_guard<std::mutex> lock(s.mu);
    s.records.clear();
    s.t0 = Clock::now();
    profiler_detail::g_active = true;
}

std::vector<OpTiming> StopProfiling() {
    profiler_detail::g_active = false;
    State& s = Get();
    std::vector<Record> records;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        records.swap(s.records);
    }
    std::vector<OpTiming> out;
    out.reserve(records.size());
    std::map<std::pair<int, int>, Event> first;  // each device's earliest start event
    for (const Record& r : records) {
        DeviceRuntime& rt = GetRuntime(r.device.type);
        if (r.end.valid()) rt.SynchronizeEvent(r.end);
        first.emplace(std::make_pair(static_cast<int>(r.device.type), r.device.index), r.start);
        const Event& origin = first.at({static_cast<int>(r.device.type), r.device.index});
        bool cpu = r.device.is_cpu();
        out.push_back({r.op->name(), r.device, r.host_start_us, r.host_us,
                       cpu ? -1.0 : static_cast<double>(rt.ElapsedMs(origin, r.start)),
                       cpu ? r.host_us / 1000.0 : static_cast<double>(rt.ElapsedMs(r.start, r.end))});
    }
    std::lock_guard<std::mutex> lock(s.mu);
    for (const Record& r : records) {
        if (!r.start.valid()) continue;
        auto& v = s.spare[{static_cast<int>(r.device.type), r.device.index}];
        v.push_back(r.start);
        v.push_back(r.end);
    }
    return out;
}

KernelTimer::KernelTimer(const Op* op, const Stream& stream)
    : op_(op), stream_(stream), host_start_us_(SinceStartUs(Clock::now())) {
    if (stream.device().is_cpu()) return;
    start_ = TakeEvent(stream.device());
    end_ = TakeEvent(stream.device());
    GetRuntime(stream.device().type).RecordEvent(start_, stream);
}

KernelTimer::~KernelTimer() {
    try {
        double host_us = SinceStartUs(Clock::now()) - host_start_us_;
        if (!stream_.device().is_cpu()) GetRuntime(stream_.device().type).RecordEvent(end_, stream_);
        State& s = Get();
        std::lock_guard<std::mutex> lock(s.mu);
        if (profiler_detail::g_active)
            s.records.push_back({op_, stream_.device(), host_start_us_, host_us, start_, end_});
    } catch (...) {
        // Profiling must never turn a finished kernel into an error.
    }
}

}  // namespace infinitrain
