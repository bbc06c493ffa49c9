// sim streams and events. Every stream (each device's default stream plus the
// created ones) has a worker thread running its closures in order; an event is
// a marker enqueued on a stream that stamps the time when it runs. Handles are
// ids that are never reused. An exception thrown by a closure becomes the
// device's sticky error, rethrown by the next synchronisation.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/sim/sim.h"

namespace infinitrain::sim {
namespace {

using Clock = std::chrono::steady_clock;

std::string Hex(const void* p) {
    std::ostringstream s;
    s << p;
    return s.str();
}

struct StreamState {
    int device = 0;
    std::mutex mu;
    std::condition_variable cv_work, cv_done;
    std::deque<std::pair<uint64_t, std::function<void()>>> queue;
    uint64_t enqueued = 0;   // under mu
    uint64_t completed = 0;  // under mu
    std::thread worker;
};

struct EventState {
    int device = 0;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0;   // generation of the latest record
    uint64_t completed = 0;  // latest generation whose marker ran
    Clock::time_point time;  // when generation `completed` ran
};

struct DeviceState {
    std::once_flag started;
    std::shared_ptr<StreamState> default_stream;
    std::mutex mu;  // streams, error
    std::vector<std::shared_ptr<StreamState>> streams;
    std::exception_ptr error;
};

// Set on worker threads, so synchronous calls from them fail instead of deadlocking.
thread_local StreamState* t_worker = nullptr;

// After Shutdown workers stop at their next closure and leak what they hold: the objects closures
// refer to may already be destroyed at exit.
std::atomic<bool> g_shutdown{false};
std::atomic<int> g_running{0};

class State {
public:
    static State& Get() {
        static State* s = new State();  // leaked: workers may outlive static destruction
        return *s;
    }

    DeviceState& Device(int index) {
        CheckDeviceIndex(index);
        DeviceState& d = *devices_[index];
        std::call_once(d.started, [&] { d.default_stream = Start(index); });
        return d;
    }

    std::shared_ptr<StreamState> GetStream(const Stream& stream) {
        DeviceState& d = Device(stream.device().index);
        if (stream.is_default()) return d.default_stream;
        std::lock_guard<std::mutex> lock(mu_);
        auto it = streams_.find(reinterpret_cast<uintptr_t>(stream.handle()));
        if (it == streams_.end()) {
            throw std::invalid_argument("sim: stream " + Hex(stream.handle()) + " is not a sim stream");
        }
        if (it->second->device != stream.device().index) {
            throw std::invalid_argument("sim: stream " + Hex(stream.handle()) + " belongs to sim:" +
                                        std::to_string(it->second->device) + ", not " + stream.device().ToString());
        }
        return it->second;
    }

    Stream Create(int device) {
        Device(device);
        std::shared_ptr<StreamState> s = Start(device);
        std::lock_guard<std::mutex> lock(mu_);
        uintptr_t id = next_id_++;
        streams_[id] = s;
        return Stream(infinitrain::Device{DeviceType::kPrivateUse1, device}, reinterpret_cast<void*>(id));
    }

    std::shared_ptr<EventState> GetEvent(const Event& event) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = events_.find(reinterpret_cast<uintptr_t>(event.handle()));
        if (it == events_.end()) {
            throw std::invalid_argument("sim: event " + Hex(event.handle()) + " is not a live sim event (destroyed?)");
        }
        if (it->second->device != event.device().index) {
            throw std::invalid_argument("sim: event " + Hex(event.handle()) +
                                        " belongs to sim:" + std::to_string(it->second->device));
        }
        return it->second;
    }

    Event CreateEvent(int device) {
        Device(device);
        auto e = std::make_shared<EventState>();
        e->device = device;
        std::lock_guard<std::mutex> lock(mu_);
        uintptr_t id = next_id_++;
        events_[id] = e;
        return Event(infinitrain::Device{DeviceType::kPrivateUse1, device}, reinterpret_cast<void*>(id));
    }

    void DestroyEvent(const Event& event) {
        GetEvent(event);
        std::lock_guard<std::mutex> lock(mu_);
        events_.erase(reinterpret_cast<uintptr_t>(event.handle()));  // pending markers hold their own reference
    }

    std::vector<std::shared_ptr<StreamState>> StreamsOf(DeviceState& d) {
        std::lock_guard<std::mutex> lock(d.mu);
        return d.streams;
    }

private:
    State() : devices_(DeviceCount()) {
        for (auto& d : devices_) d.reset(new DeviceState());
    }

    std::shared_ptr<StreamState> Start(int device);

    std::vector<std::unique_ptr<DeviceState>> devices_;
    std::mutex mu_;  // streams_, events_, next_id_
    uintptr_t next_id_ = 1;
    std::unordered_map<uintptr_t, std::shared_ptr<StreamState>> streams_;
    std::unordered_map<uintptr_t, std::shared_ptr<EventState>> events_;
};

void SetError(int device, std::exception_ptr e) {
    DeviceState& d = State::Get().Device(device);
    std::lock_guard<std::mutex> lock(d.mu);
    if (!d.error) d.error = e;  // the first error wins, as on a real device
}

void RethrowError(int device) {
    DeviceState& d = State::Get().Device(device);
    std::exception_ptr e;
    {
        std::lock_guard<std::mutex> lock(d.mu);
        std::swap(e, d.error);
    }
    if (e) std::rethrow_exception(e);
}

void WorkerLoop(std::shared_ptr<StreamState> s) {
    t_worker = s.get();
    for (;;) {
        std::function<void()> work;
        uint64_t seq;
        {
            std::unique_lock<std::mutex> lock(s->mu);
            s->cv_work.wait(lock, [&] { return !s->queue.empty(); });
            seq = s->queue.front().first;
            work = std::move(s->queue.front().second);
            s->queue.pop_front();
        }
        g_running.fetch_add(1);
        if (g_shutdown.load()) {
            new std::function<void()>(std::move(work));  // leaked on purpose, see g_shutdown
            g_running.fetch_sub(1);
            return;
        }
        try {
            work();
        } catch (...) {
            SetError(s->device, std::current_exception());
        }
        work = nullptr;
        g_running.fetch_sub(1);
        {
            std::lock_guard<std::mutex> lock(s->mu);
            s->completed = seq;
        }
        s->cv_done.notify_all();
    }
}

std::shared_ptr<StreamState> State::Start(int device) {
    auto s = std::make_shared<StreamState>();
    s->device = device;
    s->worker = std::thread(WorkerLoop, s);
    s->worker.detach();  // streams live for the process
    DeviceState& d = *devices_[device];
    std::lock_guard<std::mutex> lock(d.mu);
    d.streams.push_back(s);
    return s;
}

void Push(StreamState& s, std::function<void()> work) {
    {
        std::lock_guard<std::mutex> lock(s.mu);
        s.enqueued += 1;
        s.queue.emplace_back(s.enqueued, std::move(work));
    }
    s.cv_work.notify_one();
}

void Drain(StreamState& s) {
    if (t_worker == &s) throw std::runtime_error("sim: a stream cannot wait for itself from its own worker");
    std::unique_lock<std::mutex> lock(s.mu);
    uint64_t target = s.enqueued;
    s.cv_done.wait(lock, [&] { return s.completed >= target; });
}

}  // namespace

void Enqueue(const Stream& stream, std::function<void()> work) {
    Push(*State::Get().GetStream(stream), std::move(work));
}

Stream CreateStream(int device) { return State::Get().Create(device); }

void SynchronizeStream(const Stream& stream) {
    Drain(*State::Get().GetStream(stream));
    RethrowError(stream.device().index);
}

void StreamWaitEvent(const Stream& stream, const Event& event) {
    State& st = State::Get();
    std::shared_ptr<StreamState> s = st.GetStream(stream);
    std::shared_ptr<EventState> e = st.GetEvent(event);
    uint64_t gen;
    {
        std::lock_guard<std::mutex> lock(e->mu);
        gen = e->recorded;
    }
    if (gen == 0) return;  // never recorded: nothing to wait for (as in CUDA)
    Push(*s, [e, gen] {
        std::unique_lock<std::mutex> lock(e->mu);
        e->cv.wait(lock, [&] { return e->completed >= gen; });
    });
}

Event CreateEvent(int device) { return State::Get().CreateEvent(device); }

void DestroyEvent(const Event& event) { State::Get().DestroyEvent(event); }

void RecordEvent(const Event& event, const Stream& stream) {
    State& st = State::Get();
    if (event.device() != stream.device()) {
        throw std::invalid_argument("sim: event of " + event.device().ToString() + " recorded on a stream of " +
                                    stream.device().ToString());
    }
    std::shared_ptr<StreamState> s = st.GetStream(stream);
    std::shared_ptr<EventState> e = st.GetEvent(event);
    uint64_t gen;
    {
        std::lock_guard<std::mutex> lock(e->mu);
        gen = ++e->recorded;
    }
    Push(*s, [e, gen] {
        {
            std::lock_guard<std::mutex> lock(e->mu);
            if (gen > e->completed) {
                e->completed = gen;
                e->time = Clock::now();
            }
        }
        e->cv.notify_all();
    });
}

bool QueryEvent(const Event& event) {
    std::shared_ptr<EventState> e = State::Get().GetEvent(event);
    std::lock_guard<std::mutex> lock(e->mu);
    return e->completed >= e->recorded;
}

void SynchronizeEvent(const Event& event) {
    std::shared_ptr<EventState> e = State::Get().GetEvent(event);
    if (t_worker) throw std::runtime_error("sim: SynchronizeEvent from a stream worker would deadlock");
    {
        std::unique_lock<std::mutex> lock(e->mu);
        uint64_t gen = e->recorded;
        e->cv.wait(lock, [&] { return e->completed >= gen; });
    }
    RethrowError(event.device().index);
}

float ElapsedMs(const Event& start, const Event& end) {
    State& st = State::Get();
    Clock::time_point t[2];
    int k = 0;
    for (const Event* ev : {&start, &end}) {
        std::shared_ptr<EventState> e = st.GetEvent(*ev);
        std::lock_guard<std::mutex> lock(e->mu);
        const char* which = k == 0 ? "start" : "end";
        if (e->recorded == 0) {
            throw std::runtime_error(std::string("sim: ElapsedMs: ") + which + " event was never recorded");
        }
        if (e->completed < e->recorded) {
            throw std::runtime_error(std::string("sim: ElapsedMs: ") + which +
                                     " event has not completed yet (synchronize it first)");
        }
        t[k++] = e->time;
    }
    return std::chrono::duration<float, std::milli>(t[1] - t[0]).count();
}

void WaitForDevice(int device) {
    State& st = State::Get();
    DeviceState& d = st.Device(device);
    if (t_worker && t_worker->device == device) {
        throw std::runtime_error("sim: synchronous call on sim:" + std::to_string(device) +
                                 " from one of its own stream workers would deadlock");
    }
    for (const auto& s : st.StreamsOf(d)) Drain(*s);
}

void SynchronizeDevice(int device) {
    WaitForDevice(device);
    RethrowError(device);
}

void Shutdown() {
    g_shutdown.store(true);
    // Closures already running finish; one waiting for an event that will never come is left behind.
    auto deadline = Clock::now() + std::chrono::seconds(2);
    while (g_running.load() > 0 && Clock::now() < deadline) std::this_thread::yield();
}

}  // namespace infinitrain::sim
