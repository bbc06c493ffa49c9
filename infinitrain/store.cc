// The TCP store: a server thread multiplexing its clients with poll(), and a blocking client.
//
// Wire format, little-endian. A client first sends the handshake: the magic "ITS1", u32 length, the token; the
// server answers it as a request and serves nothing before it. A request: command byte, u32 argument count, then
// each argument as u32 length + bytes. A reply: status byte, u32 length + bytes. Commands: S set(key, value);
// G get(key), answered once the key exists; A add(key, delta as decimal) -> the new value; C check(keys...) ->
// "1"/"0"; W wait(keys...), answered once all exist; D delete(key) -> "1"/"0". Status 0 is a result; otherwise
// the body is the reason and the low bits say what was refused (1 a bad request, 2 the store is full, 3 the
// handshake), and the bit 0x80 that the server closes the connection after this reply (a frame it cannot read
// past: a size over a limit, an unknown command, a wrong token). A client sends one request at a time (the
// server closes one that sends while its get or wait is parked); a parked get or wait is dropped when its client
// disconnects.
//
// The server bounds what it holds (StoreLimits): sizes are checked as each length prefix arrives, so a huge
// prefix costs nothing; while its buffers are full, large requests and replies wait their turn (small ones go
// on), and it closes connections that do not present the token in time or stall half-way through a request or
// a reply.
#include "infinitrain/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string_view>
#include <thread>

namespace infinitrain {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[4] = {'I', 'T', 'S', '1'};
constexpr size_t kMaxToken = 256;
constexpr size_t kHandshakeMax = 8 + kMaxToken;
constexpr uint32_t kMaxArgs = 1u << 20;  // keys a wait may name: a rendezvous names every rank
constexpr size_t kMaxDelta = 32;         // an add's decimal delta
constexpr size_t kEntryOverhead = 128;   // a stored entry's map node and string headers, counted against the total
constexpr size_t kChunk = size_t{64} << 10;

constexpr char kOk = 0, kBadRequest = 1, kFull = 2, kRefused = 3, kClosing = static_cast<char>(0x80);

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

void PutU32(std::string& s, uint32_t v) {
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    return v;
}

std::string Reply(std::string_view body, char status = kOk) {
    std::string r(1, status);
    PutU32(r, static_cast<uint32_t>(body.size()));
    r.append(body);
    return r;
}

// A key for a message: escaped and cut short (keys from the wire can be anything).
std::string Printable(std::string_view key) {
    std::string s;
    for (size_t i = 0; i < key.size() && s.size() < 80; ++i) {
        unsigned char ch = static_cast<unsigned char>(key[i]);
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
            s.push_back(static_cast<char>(ch));
        } else {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02x", ch);
            s += buf;
        }
    }
    return s.size() >= 80 ? s + "..." : s;
}

std::string Bytes(size_t n) {
    if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return std::to_string(n >> 20) + " MiB";
    if (n >= (size_t{1} << 10) && n % (size_t{1} << 10) == 0) return std::to_string(n >> 10) + " KiB";
    return std::to_string(n) + " bytes";
}

bool ParseInt(std::string_view s, int64_t* v) {
    if (s.empty()) return false;
    const char* b = s.data();
    if (*b == '+') ++b;
    auto [end, ec] = std::from_chars(b, s.data() + s.size(), *v);
    return ec == std::errc() && end == s.data() + s.size();
}

bool AllInterfaces(const std::string& host) { return host.empty() || host == "0.0.0.0"; }

sockaddr_in Resolve(const std::string& host, int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (AllInterfaces(host)) {
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        return a;
    }
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc != 0 || !res) {
        throw std::runtime_error("store: cannot resolve host '" + host + "': " + gai_strerror(rc));
    }
    a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return a;
}

std::string Where(const std::string& host, int port) { return host + ":" + std::to_string(port); }

std::string Seconds(std::chrono::milliseconds t) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g s", t.count() / 1000.0);
    return buf;
}

// Calls fn(key) for each argument of a request's argument section (u32 length + bytes each); fn returns whether
// to go on.
template <typename Fn>
bool ForEachArg(std::string_view raw, Fn fn) {
    size_t pos = 0;
    while (pos + 4 <= raw.size()) {
        uint32_t len = GetU32(raw.data() + pos);
        if (!fn(raw.substr(pos + 4, len))) return false;
        pos += 4 + len;
    }
    return true;
}

std::string RandomToken() {
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof(b)) {
        ssize_t n = getrandom(b + got, sizeof(b) - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw std::runtime_error(Errno("store: getrandom"));
        got += static_cast<size_t>(n);
    }
    std::string s;
    for (unsigned char c : b) {
        char h[3];
        std::snprintf(h, sizeof(h), "%02x", c);
        s += h;
    }
    return s;
}

// A request refused: status says why; fatal, that the connection cannot go on (the reply is its last).
struct Refusal : std::runtime_error {
    Refusal(char status, bool fatal, const std::string& why) : std::runtime_error(why), status(status), fatal(fatal) {}
    char status;
    bool fatal;
};

}  // namespace

int DefaultMaxConnections() {
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 4096;
    int64_t soft = static_cast<int64_t>(std::min<rlim_t>(r.rlim_cur, 1 << 30));
    return static_cast<int>(std::clamp<int64_t>(soft - std::max<int64_t>(64, soft / 4), 16, 4096));
}

class StoreServer {
public:
    StoreServer(const std::string& host, int port, std::string token, const StoreLimits& limits)
        : token_(std::move(token)), limits_(limits) {
        if (limits_.max_connections <= 0) limits_.max_connections = DefaultMaxConnections();
        listen_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (listen_ < 0) throw std::runtime_error(Errno("store: socket"));
        int one = 1;
        setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in a{};
        try {
            a = Resolve(host, port);
        } catch (...) {
            close(listen_);
            throw;
        }
        if (bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listen_, SOMAXCONN) != 0) {
            std::string e = Errno("store: cannot listen on " + Where(host, port));
            if (errno == EADDRNOTAVAIL) e += " (not an address of this host; 0.0.0.0 listens on every interface)";
            close(listen_);
            throw std::runtime_error(e);
        }
        socklen_t len = sizeof(a);
        getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
            close(listen_);
            throw std::runtime_error(Errno("store: pipe"));
        }
        thread_ = std::thread([this] { Run(); });
    }

    ~StoreServer() {
        char c = 0;
        [[maybe_unused]] ssize_t n = write(wake_[1], &c, 1);  // wakes the loop, which then returns
        thread_.join();
        for (auto& [fd, c] : clients_) close(fd);
        close(listen_);
        close(wake_[0]);
        close(wake_[1]);
    }

    int port() const { return port_; }

private:
    struct Client {
        int fd = -1;
        std::string in;   // bytes received, not yet consumed
        std::string out;  // replies, sent from out_pos on
        size_t out_pos = 0;
        size_t scan = 0;  // how far the request at the front of in has been checked (0: not begun)
        uint32_t nargs = 0, seen = 0;
        bool authed = false, closing = false, parked = false;
        bool began_full = false;  // the request being read began while the buffers were full
        bool held_back = false;   // ... and waits for room (not a stall: no deadline)
        char cmd = 0;             // a parked get's or wait's
        std::string keys;         // ... and its keys, as on the wire
        Clock::time_point accepted, in_progress, out_progress, close_by;
        size_t held = 0;  // what this client counts in held_
        bool pending() const { return out_pos < out.size(); }
    };
    using Clients = std::map<int, Client>;

    // Nothing may leave the server's thread: a failure outside one connection's handling (out of memory
    // building the poll set, say) backs off and goes on.
    void Run() noexcept {
        for (;;) {
            try {
                if (!Step()) return;
            } catch (...) {
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
        }
    }

    bool Full() const { return held_ >= limits_.max_buffered_bytes; }

    // One poll round; false once told to stop.
    bool Step() {
        auto now = Clock::now();
        for (auto it = clients_.begin(); it != clients_.end();) {
            auto d = Deadline(it->second);
            it = d && *d <= now ? Drop(it, true) : std::next(it);
        }
        // Replies held back while the buffers were full go out after this round has taken in the requests that
        // are ready (so that clients which do not read theirs cannot keep the others waiting): poll without
        // blocking, then Unpark below.
        const bool resume = throttled_ && !Full();
        bool accepting = now >= accept_paused_until_ &&
                         (clients_.size() < static_cast<size_t>(limits_.max_connections) || unauthed_ > 0);
        fds_.clear();
        fds_.push_back({wake_[0], POLLIN, 0});
        fds_.push_back({accepting ? listen_ : -1, POLLIN, 0});  // a negative fd is skipped by poll
        for (auto& [fd, c] : clients_) {
            bool in = WantsInput(c);
            bool held = !in && c.authed && !c.closing && !c.parked && !c.pending() && !c.in.empty();
            if (held && big_reader_ < 0) {
                big_reader_ = fd;  // one held-back request at a time goes on, or they could wait for each other
                in = WantsInput(c);
                held = false;
            }
            if (c.held_back && !held) c.in_progress = now;  // its stall clock starts again from here
            c.held_back = held;
            short ev = POLLRDHUP | (in ? POLLIN : 0) | (c.pending() ? POLLOUT : 0);
            fds_.push_back({fd, ev, 0});
        }
        if (poll(fds_.data(), fds_.size(), resume ? 0 : PollTimeout(now, accepting)) < 0) {
            if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            return true;
        }
        if (fds_[0].revents) return false;
        now = Clock::now();
        for (size_t i = 2; i < fds_.size(); ++i) {
            if (!fds_[i].revents) continue;
            auto it = clients_.find(fds_[i].fd);
            if (it == clients_.end()) continue;
            if (!Serve(it->first, it->second, fds_[i].revents, now)) Drop(it);
        }
        // After the clients, so that a descriptor closed above and reused by a new connection is not mistaken
        // for the old one's poll result.
        if (fds_[1].revents & POLLIN) Accept(now);
        if (throttled_ && !Full()) {
            throttled_ = false;
            Unpark(now);  // sets it again if the buffers fill before every held reply is out
        }
        return true;
    }

    // A parked client is watched too: sending while its get or wait is pending breaks the protocol (and, were
    // it not read, would hide its hang-up behind a full receive window).
    bool WantsInput(const Client& c) const {
        return !c.closing && (c.parked || (!c.pending() && c.in.size() < ReadCap(c)));
    }

    // While the buffers are full a request that begins is read only as far as a small one goes (64 KiB: every
    // request but a large set), so that small requests are still served; a large one waits for room, or for its
    // turn as big_reader_. One begun before is read to its end.
    size_t ReadCap(const Client& c) const {
        if (!c.authed) return kHandshakeMax;
        bool wait = c.began_full && Full() && big_reader_ != c.fd;
        return wait ? kChunk : limits_.max_request_bytes() + kChunk;
    }

    std::optional<Clock::time_point> Deadline(const Client& c) const {
        if (c.closing) return c.close_by;
        if (!c.authed) return c.accepted + limits_.handshake_timeout;
        std::optional<Clock::time_point> d;
        if (!c.in.empty() && !c.held_back) d = c.in_progress + limits_.stall_timeout;
        if (c.pending()) d = std::min(d.value_or(Clock::time_point::max()), c.out_progress + limits_.stall_timeout);
        return d;  // an idle or parked client may stay (a wait ends on the client's side)
    }

    int PollTimeout(Clock::time_point now, bool accepting) const {
        auto next = Clock::time_point::max();
        if (!accepting && now < accept_paused_until_) next = accept_paused_until_;
        for (auto& [fd, c] : clients_) {
            if (auto d = Deadline(c)) next = std::min(next, *d);
        }
        if (next == Clock::time_point::max()) return -1;
        // Rounded up: a deadline a fraction of a millisecond away must not make a zero timeout (a spin).
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
        return static_cast<int>(std::clamp<int64_t>(ms, 1, 1 << 30));
    }

    // abort: reset the connection rather than close it, so that the kernel does not go on holding (and
    // trying to send) what a stalled or evicted peer never read.
    Clients::iterator Drop(Clients::iterator it, bool abort = false) {
        if (big_reader_ == it->first) big_reader_ = -1;
        if (abort) {
            linger reset{1, 0};
            setsockopt(it->first, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
        }
        close(it->first);
        held_ -= it->second.held;
        if (it->second.parked) parked_bytes_ -= it->second.keys.size();
        if (!it->second.authed) --unauthed_;
        return clients_.erase(it);
    }

    // Closes the connection that has waited longest for its handshake; false if every one has shown its token.
    bool EvictUnauthed() {
        if (unauthed_ == 0) return false;
        auto oldest = clients_.end();
        for (auto it = clients_.begin(); it != clients_.end(); ++it) {
            if (!it->second.authed && (oldest == clients_.end() || it->second.accepted < oldest->second.accepted))
                oldest = it;
        }
        if (oldest == clients_.end()) return false;
        Drop(oldest, true);
        return true;
    }

    void Accept(Clock::time_point now) {
        // A bounded burst per round, so that a flood cannot evict a connection accepted in the same round.
        int burst = std::clamp(limits_.max_connections / 4, 1, 64);
        const size_t cap = static_cast<size_t>(limits_.max_connections);
        for (int i = 0; i < burst; ++i) {
            // At the cap a new connection takes the place of one still without a token; when every one has
            // shown it, new ones wait in the backlog.
            if (clients_.size() >= cap && unauthed_ == 0) return;
            int fd = accept4(listen_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) return;
                // Out of descriptors (or memory): free one held by a connection without a token, else wait a
                // little; polling the still-readable listening socket now would spin.
                if ((errno == EMFILE || errno == ENFILE) && EvictUnauthed()) continue;
                accept_paused_until_ = now + std::chrono::milliseconds(100);
                return;
            }
            if (clients_.size() >= cap) EvictUnauthed();
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            Client& c = clients_[fd];
            c.fd = fd;
            c.accepted = c.in_progress = c.out_progress = now;
            ++unauthed_;
            Account(c);
        }
    }

    // Parked keys are bounded apart (parked_bytes_): counting them here would stop the reads of the very sets
    // that release them.
    void Account(Client& c) {
        size_t now = c.in.capacity() + c.out.capacity();
        held_ = held_ - c.held + now;
        c.held = now;
    }

    void Send(Client& c, const std::string& reply, Clock::time_point now) {
        if (!c.pending()) c.out_progress = now;
        c.out += reply;
        Account(c);
    }

    // Handles one poll result of a client; false to close it.
    bool Serve(int fd, Client& c, short revents, Clock::time_point now) {
        try {
            // A peer gone, or one that shut its sending side: nothing more will come from it.
            if (revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return false;
            if ((revents & POLLIN) && c.parked) return false;
            if ((revents & POLLIN) && !Read(fd, c, now)) return false;
            return Pump(fd, c, now);
        } catch (...) {
            return false;  // out of memory for this connection, say: it goes, the server stays
        }
    }

    bool Read(int fd, Client& c, Clock::time_point now) {
        if (c.in.empty()) c.began_full = Full();
        char buf[kChunk];
        for (size_t cap; c.in.size() < (cap = ReadCap(c));) {
            ssize_t n = recv(fd, buf, std::min(sizeof(buf), cap - c.in.size()), 0);
            if (n > 0) {
                c.in.append(buf, static_cast<size_t>(n));
                c.in_progress = now;
                Account(c);
                continue;
            }
            if (n == 0) return false;
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return false;
        }
        return true;
    }

    bool Flush(int fd, Client& c, Clock::time_point now) {
        while (c.pending()) {
            ssize_t n = send(fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
            if (n > 0) {
                c.out_pos += static_cast<size_t>(n);
                c.out_progress = now;
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
            return false;
        }
        Release(c.out);
        c.out_pos = 0;
        Account(c);
        return true;
    }

    // Empties s, giving back a large buffer (a 16 MiB request's must not stay with an idle connection).
    static void Release(std::string& s) {
        if (s.capacity() > kChunk) {
            std::string().swap(s);
        } else {
            s.clear();
        }
    }

    // Answers the client's complete requests, one at a time: the next once the last reply is out.
    bool Pump(int fd, Client& c, Clock::time_point now) {
        for (;;) {
            if (!Flush(fd, c, now)) return false;
            if (c.pending()) return true;
            if (c.closing) return false;  // its last reply is out
            if (c.parked) return true;
            try {
                if (!(c.authed ? Request(c, now) : Handshake(c, now))) return true;
            } catch (const Refusal& e) {
                Send(c, Reply(e.what(), static_cast<char>(e.status | (e.fatal ? kClosing : 0))), now);
                if (e.fatal) {
                    c.closing = true;
                    c.close_by = now + std::min(limits_.stall_timeout, std::chrono::milliseconds(1000));
                }
            } catch (const std::bad_alloc&) {
                throw;
            } catch (const std::exception& e) {
                Send(c, Reply(e.what(), kBadRequest), now);
            }
        }
    }

    bool Handshake(Client& c, Clock::time_point now) {
        size_t m = std::min(c.in.size(), sizeof(kMagic));
        if (std::memcmp(c.in.data(), kMagic, m) != 0) {
            throw Refusal(kRefused, true, "store: not a store client's handshake (expected 'ITS1' and the token)");
        }
        if (c.in.size() < 8) return false;
        uint32_t len = GetU32(c.in.data() + 4);
        if (len > kMaxToken) throw Refusal(kRefused, true, "store: a handshake token over " + Bytes(kMaxToken));
        if (c.in.size() < 8 + len) return false;
        // Compared in time independent of where they differ.
        unsigned char diff = len != token_.size();
        for (size_t i = 0; i < len; ++i) diff |= c.in[8 + i] ^ token_[i % token_.size()];
        c.in.erase(0, 8 + len);
        if (diff) {
            throw Refusal(kRefused, true,
                          "store: wrong token (every process must present the run's token: the launcher hands it to "
                          "its workers as $INFINITRAIN_STORE_TOKEN)");
        }
        c.authed = true;
        --unauthed_;
        Send(c, Reply(""), now);
        return true;
    }

    // Checks the request at the front of c.in as far as it has come, each size as soon as its prefix is in;
    // handles it once whole. False while incomplete.
    bool Request(Client& c, Clock::time_point now) {
        const std::string& in = c.in;
        if (c.scan == 0) {
            if (in.empty()) return false;
            char cmd = in[0];
            if (std::strchr("SGACWD", cmd) == nullptr || cmd == 0) {
                char buf[64];
                std::snprintf(buf, sizeof(buf), "store: unknown command byte 0x%02x", static_cast<unsigned char>(cmd));
                throw Refusal(kBadRequest, true, buf);
            }
            if (in.size() < 5) return false;
            c.nargs = GetU32(in.data() + 1);
            uint32_t want = cmd == 'S' || cmd == 'A' ? 2 : cmd == 'G' || cmd == 'D' ? 1 : 0;
            if (want ? c.nargs != want : c.nargs > kMaxArgs) {
                throw Refusal(
                    kBadRequest, true,
                    std::string("store: command '") + cmd + "' with " + std::to_string(c.nargs) + " arguments");
            }
            c.scan = 5;
            c.seen = 0;
        }
        const char cmd = in[0];
        while (c.seen < c.nargs) {
            if (in.size() < c.scan + 4) return false;
            size_t len = GetU32(in.data() + c.scan);
            bool value = cmd == 'S' && c.seen == 1, delta = cmd == 'A' && c.seen == 1;
            size_t cap = value ? limits_.max_value_bytes : delta ? kMaxDelta : limits_.max_key_bytes;
            if (len > cap) {
                throw Refusal(kBadRequest, true,
                              std::string("store: a ") +
                                  (value   ? "value"
                                   : delta ? "delta"
                                           : "key") +
                                  " of " + std::to_string(len) + " bytes, over the store's limit of " + Bytes(cap));
            }
            if (c.scan + 4 + len > limits_.max_request_bytes()) {
                throw Refusal(kBadRequest, true,
                              "store: a request over the store's limit of " + Bytes(limits_.max_request_bytes()));
            }
            if (in.size() < c.scan + 4 + len) return false;
            c.scan += 4 + len;
            ++c.seen;
        }
        std::string_view raw(in.data() + 5, c.scan - 5);
        const size_t used = c.scan;
        c.scan = 0;
        try {
            Handle(c, cmd, raw, now);  // raw points into c.in: consumed only after
        } catch (...) {
            Consume(c, used);  // a refused request is gone too, or it would be handled again
            throw;
        }
        Consume(c, used);
        return true;
    }

    void Consume(Client& c, size_t used) {
        if (big_reader_ == c.fd) big_reader_ = -1;
        c.in.erase(0, used);
        if (c.in.empty()) Release(c.in);
        Account(c);
    }

    void Handle(Client& c, char cmd, std::string_view raw, Clock::time_point now) {
        std::string_view a[2];
        if (cmd != 'C' && cmd != 'W') {
            int i = 0;
            ForEachArg(raw, [&](std::string_view s) {
                a[i++] = s;
                return true;
            });
        }
        switch (cmd) {
            case 'S':
                Put(a[0], std::string(a[1]));
                Send(c, Reply(""), now);
                Unpark(now);
                break;
            case 'A': {
                int64_t v = 0, old = 0;
                if (!ParseInt(a[1], &v)) throw std::invalid_argument("store: add's delta is not an integer");
                auto it = data_.find(a[0]);
                if (it != data_.end()) {
                    if (!ParseInt(it->second, &old)) {
                        throw std::invalid_argument("store: add to key '" + Printable(a[0]) +
                                                    "', whose value is not an integer");
                    }
                    if (__builtin_add_overflow(old, v, &v)) {
                        throw std::invalid_argument("store: add to key '" + Printable(a[0]) + "' overflows int64");
                    }
                }
                std::string s = std::to_string(v);
                Put(a[0], s);
                Send(c, Reply(s), now);
                Unpark(now);
                break;
            }
            case 'C':
                Send(c, Reply(Present(raw) ? "1" : "0"), now);
                break;
            case 'D': {
                auto it = data_.find(a[0]);
                bool had = it != data_.end();
                if (had) {
                    stored_ -= it->first.size() + it->second.size() + kEntryOverhead;
                    data_.erase(it);
                }
                Send(c, Reply(had ? "1" : "0"), now);
                break;
            }
            case 'G':
            case 'W':
                if (Present(raw)) {
                    std::string_view v = cmd == 'G' ? std::string_view(data_.find(a[0])->second) : "";
                    if (v.size() <= kChunk || !Full()) {
                        Send(c, Reply(v), now);
                        break;
                    }
                    throttled_ = true;  // a large reply waits, parked, for the buffers to drain
                }
                // The keys are kept as they came (no per-key overhead); all parked waits together are bounded
                // like the buffers, so that a rendezvous of thousands of ranks fits and a flood does not.
                if (parked_bytes_ + raw.size() > limits_.max_buffered_bytes) {
                    throw Refusal(kFull, false,
                                  "store: too many keys waited for at once (over " + Bytes(limits_.max_buffered_bytes) +
                                      " of them)");
                }
                c.cmd = cmd;
                c.keys.assign(raw);
                c.parked = true;
                parked_bytes_ += raw.size();
                Account(c);
                break;
        }
    }

    void Put(std::string_view key, std::string value) {
        auto it = data_.find(key);
        size_t old = it == data_.end() ? 0 : it->first.size() + it->second.size() + kEntryOverhead;
        size_t size = key.size() + value.size() + kEntryOverhead;
        if (stored_ - old + size > limits_.max_total_bytes) {
            throw Refusal(kFull, false,
                          "store: full: setting key '" + Printable(key) + "' (" + std::to_string(value.size()) +
                              " bytes) would take it past its limit of " + Bytes(limits_.max_total_bytes) + " (" +
                              std::to_string(stored_) + " bytes stored)");
        }
        if (it == data_.end()) {
            data_.emplace(std::string(key), std::move(value));
        } else {
            it->second = std::move(value);
        }
        stored_ = stored_ - old + size;
    }

    bool Present(std::string_view raw) const {
        return ForEachArg(raw, [this](std::string_view k) { return data_.find(k) != data_.end(); });
    }

    // Answers every parked get or wait whose keys all exist now; a large reply only while the buffers have room.
    void Unpark(Clock::time_point now) {
        for (auto& [fd, c] : clients_) {
            if (!c.parked || !Present(c.keys)) continue;
            std::string_view reply;
            if (c.cmd == 'G') {
                ForEachArg(c.keys, [&](std::string_view k) {
                    reply = data_.find(k)->second;
                    return false;
                });
            }
            if (reply.size() > kChunk && Full()) {
                throttled_ = true;
                continue;
            }
            c.parked = false;
            parked_bytes_ -= c.keys.size();
            Send(c, Reply(reply), now);
            Release(c.keys);
            Account(c);
        }
    }

    std::string token_;
    StoreLimits limits_;
    int listen_ = -1;
    int port_ = 0;
    int wake_[2] = {-1, -1};
    Clients clients_;
    std::vector<pollfd> fds_;
    std::map<std::string, std::string, std::less<>> data_;
    size_t stored_ = 0;        // keys + values + per-entry overhead
    size_t held_ = 0;          // the clients' buffers
    size_t parked_bytes_ = 0;  // keys of parked waits
    size_t unauthed_ = 0;      // connections still to show the token
    bool throttled_ = false;   // some large reply waits for the buffers to drain
    int big_reader_ = -1;      // the client whose held-back request is read to its end now
    Clock::time_point accept_paused_until_{};
    std::thread thread_;
};

TcpStore::TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout,
                   std::optional<std::string> token, const StoreLimits& limits)
    : host_(host), port_(port), timeout_(timeout), limits_(limits) {
    if (port < 0 || port > 65535)
        throw std::invalid_argument("store: port must be in [0, 65535], got " + std::to_string(port));
    if (timeout.count() <= 0) throw std::invalid_argument("store: the timeout must be positive");
    if (!serve && port == 0) throw std::invalid_argument("store: a client needs the server's port");
    if (token) {
        token_ = *token;
        if (token_.empty()) throw std::invalid_argument("store: the token must not be empty");
    } else if (const char* env = std::getenv(kStoreTokenEnv); env && *env) {
        token_ = env;
    } else if (serve) {
        token_ = RandomToken();
    } else {
        throw std::invalid_argument(std::string("store: no token: pass one, or set $") + kStoreTokenEnv +
                                    " to the run's (infinitrain.run sets it for its workers)");
    }
    if (token_.size() > kMaxToken) {
        throw std::invalid_argument("store: the token must be at most " + Bytes(kMaxToken) + ", got " +
                                    std::to_string(token_.size()) + " bytes");
    }
    if (limits_.max_key_bytes < 1 || limits_.max_value_bytes < 1 || limits_.max_request_bytes() > (1u << 31) ||
        limits_.handshake_timeout.count() <= 0 || limits_.stall_timeout.count() <= 0) {
        throw std::invalid_argument("store: limits must be positive, with keys and values under 2 GiB");
    }
    if (serve) {
        server_ = std::make_unique<StoreServer>(host, port, token_, limits_);
        port_ = server_->port();
        if (AllInterfaces(host_)) host_ = "127.0.0.1";
    }
    Reconnect();
}

TcpStore::~TcpStore() {
    if (fd_ >= 0) close(fd_);
    server_.reset();
}

namespace {

// Reads one reply from fd by deadline: its status and body, or -1 when the connection closed, -2 at the deadline.
int ReadReply(int fd, Clock::time_point deadline, size_t max_body, std::string* body, std::string* why) {
    std::string buf;
    for (;;) {
        if (buf.size() >= 5) {
            size_t len = GetU32(buf.data() + 1);
            if (len > max_body) {
                *why = "a reply of " + std::to_string(len) + " bytes (not a store server?)";
                return -1;
            }
            if (buf.size() >= 5 + len) {
                *body = buf.substr(5, len);
                return static_cast<unsigned char>(buf[0]);
            }
        }
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return -2;
        pollfd p{fd, POLLIN, 0};
        int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));  // a long wait, in pieces
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) {
            *why = Errno("poll");
            return -1;
        }
        if (rc == 0) continue;
        char tmp[65536];
        ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            *why = n == 0 ? "connection closed" : Errno("recv");
            return -1;
        }
        buf.append(tmp, static_cast<size_t>(n));
    }
}

bool SendAll(int fd, const std::string& s) {
    for (size_t sent = 0; sent < s.size();) {
        ssize_t n = send(fd, s.data() + sent, s.size() - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        sent += static_cast<size_t>(n);
    }
    return true;
}

}  // namespace

void TcpStore::Reconnect() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    sockaddr_in a = Resolve(host_, port_);
    std::string hello(kMagic, sizeof(kMagic));
    PutU32(hello, static_cast<uint32_t>(token_.size()));
    hello += token_;
    auto deadline = Clock::now() + timeout_;
    auto pause = std::chrono::milliseconds(10);
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) throw std::runtime_error(Errno("store: socket"));
        std::string why;
        if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            std::string body;
            int status = SendAll(fd, hello) ? ReadReply(fd, deadline, 1 << 16, &body, &why) : -1;
            if (status == kOk) {
                fd_ = fd;
                return;
            }
            if (status >= 0 && (status & 0x7f) == kRefused) {
                close(fd);
                throw StoreAuthError("store at " + Where(host_, port_) + " refused this process: " + body);
            }
            if (status >= 0) why = body;
            if (status == -2) why = "no answer to the handshake";
            // Otherwise closed before answering (a server at its connection limit, say): try again.
        } else {
            why = std::strerror(errno);
        }
        close(fd);
        if (Clock::now() + pause > deadline) {
            throw StoreTimeout("store: cannot connect to " + Where(host_, port_) + " within " + Seconds(timeout_) +
                               " (" + why + "): is the process serving it (the launcher or rank 0) running?");
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(200));
    }
}

std::string TcpStore::Call(char cmd, const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                           const std::string& waiting_for) {
    // The server's limits, checked here first so that the caller hears which one.
    if (args.size() > kMaxArgs) throw std::invalid_argument("store: more than 2^20 keys in one request");
    std::string req(1, cmd);
    PutU32(req, static_cast<uint32_t>(args.size()));
    for (size_t i = 0; i < args.size(); ++i) {
        bool value = cmd == 'S' && i == 1;
        size_t cap = value ? limits_.max_value_bytes : limits_.max_key_bytes;
        if (args[i].size() > cap) {
            throw std::invalid_argument(std::string("store: a ") + (value ? "value" : "key") + " of " +
                                        std::to_string(args[i].size()) + " bytes, over the store's limit of " +
                                        Bytes(cap) + (value ? "" : " ('" + Printable(args[i]) + "')"));
        }
        PutU32(req, static_cast<uint32_t>(args[i].size()));
        req += args[i];
    }
    if (req.size() > limits_.max_request_bytes()) {
        throw std::invalid_argument("store: a request of " + std::to_string(req.size()) +
                                    " bytes, over the store's limit of " + Bytes(limits_.max_request_bytes()));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) Reconnect();
    const std::string where = "store at " + Where(host_, port_);
    auto drop = [&] {
        close(fd_);
        fd_ = -1;
    };
    if (!SendAll(fd_, req)) {
        std::string e = Errno("send");
        drop();
        throw std::runtime_error(where + ": " + e + " (the process serving it exited?)");
    }
    auto deadline = Clock::now() + std::min(timeout, std::chrono::milliseconds(int64_t{1} << 40));
    std::string body, why;
    int status = ReadReply(fd_, deadline, limits_.max_value_bytes + (1 << 16), &body, &why);
    if (status == -2) {
        drop();  // the server drops the parked request with the connection
        throw StoreTimeout(where + ": waited " + Seconds(timeout) + " for " + waiting_for);
    }
    if (status == -1) {
        drop();
        throw std::runtime_error(where + ": " + why + " (the process serving it exited?)");
    }
    if (status & 0x80) drop();  // the server closes it after this reply
    switch (status & 0x7f) {
        case kOk:
            return body;
        case kFull:
            throw std::runtime_error(body);
        case kRefused:
            throw StoreAuthError(body);
        default:
            throw std::invalid_argument(body);
    }
}

namespace {
std::string Keys(const std::vector<std::string>& keys) {
    std::string s;
    for (const std::string& k : keys) s += (s.empty() ? "key(s) '" : "', '") + k;
    return s + "'";
}
}  // namespace

void TcpStore::Set(const std::string& key, const std::string& value) { Call('S', {key, value}, timeout_, "a reply"); }

std::string TcpStore::Get(const std::string& key) { return Call('G', {key}, timeout_, Keys({key})); }

int64_t TcpStore::Add(const std::string& key, int64_t delta) {
    return std::stoll(Call('A', {key, std::to_string(delta)}, timeout_, "a reply"));
}

bool TcpStore::Check(const std::vector<std::string>& keys) { return Call('C', keys, timeout_, "a reply") == "1"; }

void TcpStore::Wait(const std::vector<std::string>& keys) { Wait(keys, timeout_); }

void TcpStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    Call('W', keys, timeout, Keys(keys));
}

bool TcpStore::Delete(const std::string& key) { return Call('D', {key}, timeout_, "a reply") == "1"; }

}  // namespace infinitrain
