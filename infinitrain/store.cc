// The TCP store: a server thread multiplexing its clients with poll(), and a blocking client.
//
// Wire format, both ways little-endian. A request: command byte, u32 argument count, then each argument as
// u32 length + bytes. A reply: status byte (0), u32 length + bytes. Commands: S set(key, value); G get(key),
// answered once the key exists; A add(key, delta as decimal) -> the new value; C check(keys...) -> "1"/"0";
// W wait(keys...), answered once all exist; D delete(key) -> "1"/"0". A bad request is answered with status 1
// and the reason. A client sends one request at a time; a parked get or wait is dropped when its client
// disconnects.
#include "infinitrain/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

namespace infinitrain {
namespace {

constexpr uint32_t kMaxField = 1u << 30;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

void PutU32(std::string& s, uint32_t v) {
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    return v;
}

std::string Reply(const std::string& body, char status = '\0') {
    std::string r(1, status);
    PutU32(r, static_cast<uint32_t>(body.size()));
    return r + body;
}

constexpr uint32_t kMaxArgs = 1u << 20;  // keys a wait may name: a rendezvous names every rank

// Parses one request at the front of buf; false while incomplete. Throws on a malformed one.
bool ParseRequest(const std::string& buf, size_t* used, char* cmd, std::vector<std::string>* args) {
    if (buf.size() < 5) return false;
    uint32_t n = GetU32(buf.data() + 1);
    if (n > kMaxArgs) throw std::runtime_error("store: request with " + std::to_string(n) + " arguments");
    size_t pos = 5;
    args->clear();
    for (uint32_t i = 0; i < n; ++i) {
        if (buf.size() < pos + 4) return false;
        uint32_t len = GetU32(buf.data() + pos);
        if (len > kMaxField) throw std::runtime_error("store: field of " + std::to_string(len) + " bytes");
        pos += 4;
        if (buf.size() < pos + len) return false;
        args->push_back(buf.substr(pos, len));
        pos += len;
    }
    *cmd = buf[0];
    *used = pos;
    return true;
}

sockaddr_in Resolve(const std::string& host, int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (host.empty() || host == "0.0.0.0") {
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

}  // namespace

class StoreServer {
public:
    StoreServer(const std::string& host, int port) {
        listen_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (listen_ < 0) throw std::runtime_error(Errno("store: socket"));
        int one = 1;
        setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in a = Resolve(host, port);
        if (bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listen_, 512) != 0) {
            std::string e = Errno("store: cannot listen on " + Where(host, port));
            close(listen_);
            throw std::runtime_error(e);
        }
        socklen_t len = sizeof(a);
        getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        if (pipe2(wake_, O_CLOEXEC) != 0) {
            close(listen_);
            throw std::runtime_error(Errno("store: pipe"));
        }
        thread_ = std::thread([this] { Loop(); });
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
        std::string in, out;
        bool parked = false;
        char cmd = 0;
        std::vector<std::string> keys;
    };

    // The loop catches everything: nothing may leave the server's thread.
    void Loop() {
        for (;;) {
            std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_, POLLIN, 0}};
            for (auto& [fd, c] : clients_) {
                fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
            }
            if (poll(fds.data(), fds.size(), -1) < 0) {
                if (errno == EINTR) continue;
                return;
            }
            if (fds[0].revents) return;
            if (fds[1].revents & POLLIN) Accept();
            for (size_t i = 2; i < fds.size(); ++i) {
                if (!fds[i].revents) continue;
                auto it = clients_.find(fds[i].fd);
                if (it == clients_.end()) continue;
                bool ok = true;
                try {
                    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) ok = Read(it->first, it->second);
                    if (ok && (fds[i].revents & POLLOUT)) ok = Flush(it->first, it->second);
                } catch (...) {
                    ok = false;  // a malformed request: drop that client
                }
                if (!ok) {
                    close(it->first);
                    clients_.erase(it);
                }
            }
        }
    }

    void Accept() {
        int fd = accept4(listen_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        clients_[fd] = Client{};
    }

    bool Read(int fd, Client& c) {
        char buf[65536];
        for (;;) {
            ssize_t n = recv(fd, buf, sizeof(buf), 0);
            if (n > 0) {
                c.in.append(buf, static_cast<size_t>(n));
                continue;
            }
            if (n == 0) return false;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            return false;
        }
        Serve(c);
        return Flush(fd, c);
    }

    bool Flush(int fd, Client& c) {
        while (!c.out.empty()) {
            ssize_t n = send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
            if (n > 0) {
                c.out.erase(0, static_cast<size_t>(n));
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
            if (n < 0 && errno == EINTR) continue;
            return false;
        }
        return true;
    }

    // Answers the client's complete requests; stops at one that must wait.
    void Serve(Client& c) {
        size_t used = 0;
        char cmd = 0;
        std::vector<std::string> args;
        while (!c.parked && ParseRequest(c.in, &used, &cmd, &args)) {
            c.in.erase(0, used);
            try {
                Handle(c, cmd, args);
            } catch (const std::exception& e) {  // a bad request gets an error reply; the client stays
                c.parked = false;
                c.out += Reply(e.what(), '\1');
            }
        }
    }

    bool Present(const std::vector<std::string>& keys) const {
        return std::all_of(keys.begin(), keys.end(), [this](const std::string& k) { return data_.count(k) > 0; });
    }

    void Handle(Client& c, char cmd, std::vector<std::string>& args) {
        auto need = [&](size_t n) {
            if (args.size() != n) throw std::runtime_error("store: bad request");
        };
        switch (cmd) {
            case 'S':
                need(2);
                data_[args[0]] = args[1];
                c.out += Reply("");
                Unpark();
                break;
            case 'A': {
                need(2);
                int64_t v = std::stoll(args[1]);
                auto it = data_.find(args[0]);
                if (it != data_.end()) {
                    size_t end = 0;
                    int64_t old = 0;
                    try {
                        old = std::stoll(it->second, &end);
                    } catch (const std::exception&) {
                        end = 0;
                    }
                    if (end == 0 || end != it->second.size()) {
                        throw std::invalid_argument("store: add to key '" + args[0] +
                                                    "', whose value is not an integer");
                    }
                    v += old;
                }
                data_[args[0]] = std::to_string(v);
                c.out += Reply(std::to_string(v));
                Unpark();
                break;
            }
            case 'C':
                c.out += Reply(Present(args) ? "1" : "0");
                break;
            case 'D':
                need(1);
                c.out += Reply(data_.erase(args[0]) ? "1" : "0");
                break;
            case 'G':
            case 'W':
                if (cmd == 'G') need(1);
                c.cmd = cmd;
                c.keys = args;
                c.parked = true;
                Unpark();
                break;
            default:
                throw std::runtime_error("store: unknown command");
        }
    }

    // Answers every parked get or wait whose keys all exist now.
    void Unpark() {
        for (auto& [fd, c] : clients_) {
            if (!c.parked || !Present(c.keys)) continue;
            c.parked = false;
            c.out += Reply(c.cmd == 'G' ? data_[c.keys[0]] : "");
        }
    }

    int listen_ = -1;
    int port_ = 0;
    int wake_[2] = {-1, -1};
    std::map<int, Client> clients_;
    std::map<std::string, std::string> data_;
    std::thread thread_;
};

TcpStore::TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
    if (port < 0 || port > 65535)
        throw std::invalid_argument("store: port must be in [0, 65535], got " + std::to_string(port));
    if (timeout.count() <= 0) throw std::invalid_argument("store: the timeout must be positive");
    if (serve) {
        server_ = std::make_unique<StoreServer>(host, port);
        port_ = server_->port();
        if (host_.empty() || host_ == "0.0.0.0") host_ = "127.0.0.1";
    } else if (port == 0) {
        throw std::invalid_argument("store: a client needs the server's port");
    }
    Reconnect();
}

TcpStore::~TcpStore() {
    if (fd_ >= 0) close(fd_);
    server_.reset();
}

void TcpStore::Reconnect() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    sockaddr_in a = Resolve(host_, port_);
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    auto pause = std::chrono::milliseconds(10);
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) throw std::runtime_error(Errno("store: socket"));
        if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            fd_ = fd;
            return;
        }
        std::string why = std::strerror(errno);
        close(fd);
        if (std::chrono::steady_clock::now() + pause > deadline) {
            throw StoreTimeout("store: cannot connect to " + Where(host_, port_) + " within " + Seconds(timeout_) +
                               " (" + why + "): is the process serving it (the launcher or rank 0) running?");
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(200));
    }
}

std::string TcpStore::Call(char cmd, const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                           const std::string& waiting_for) {
    std::string req(1, cmd);
    PutU32(req, static_cast<uint32_t>(args.size()));
    for (const std::string& a : args) {
        if (a.size() > kMaxField) throw std::invalid_argument("store: a key or value over 1 GiB");
        PutU32(req, static_cast<uint32_t>(a.size()));
        req += a;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) Reconnect();
    const std::string where = "store at " + Where(host_, port_);
    auto lost = [&](const std::string& why) {
        close(fd_);
        fd_ = -1;
        return std::runtime_error(where + ": " + why + " (the process serving it exited?)");
    };
    for (size_t sent = 0; sent < req.size();) {
        ssize_t n = send(fd_, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw lost(Errno("send"));
        sent += static_cast<size_t>(n);
    }
    auto deadline = std::chrono::steady_clock::now() + std::min(timeout, std::chrono::milliseconds(int64_t{1} << 40));
    std::string buf;
    for (;;) {
        if (buf.size() >= 5 && buf.size() >= 5 + GetU32(buf.data() + 1)) {
            std::string body = buf.substr(5, GetU32(buf.data() + 1));
            if (buf[0] != '\0') throw std::invalid_argument(body);
            return body;
        }
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        pollfd p{fd_, POLLIN, 0};
        int rc = poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30)));
        if (rc < 0 && errno == EINTR) continue;
        if (rc == 0 && std::chrono::steady_clock::now() < deadline) continue;  // a long wait, in pieces
        if (rc == 0) {
            close(fd_);  // the server drops the parked request with the connection
            fd_ = -1;
            throw StoreTimeout(where + ": waited " + Seconds(timeout) + " for " + waiting_for);
        }
        char tmp[65536];
        ssize_t n = recv(fd_, tmp, sizeof(tmp), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw lost(n == 0 ? "connection closed" : Errno("recv"));
        buf.append(tmp, static_cast<size_t>(n));
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
