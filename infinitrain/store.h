// A TCP key-value store for rendezvous: one process serves it (the launcher, or rank 0), every rank connects
// to it to exchange collective unique ids and addresses and to build barriers. Values are bytes; a get waits
// until its key is set, up to the store's timeout.
//
// The server listens on the address it is given only ("0.0.0.0" or "" for every interface), serves only clients
// that present the store's token first (a per-run secret), and bounds what it holds: see StoreLimits.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace infinitrain {

// Raised when a wait outlasts the timeout; the message names the keys still missing.
class StoreTimeout : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Raised when the server refuses this client's token.
class StoreAuthError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The environment variable a store without an explicit token reads (the launcher sets it for its workers).
inline constexpr const char* kStoreTokenEnv = "INFINITRAIN_STORE_TOKEN";

// What a server accepts. Keys are short names ("rdzv1/17", "gloo/<prefix>/3"); the largest values are Gloo's
// per-rank address lists (about 100 bytes per peer) and ZeRO's per-rank parameter layouts, so 16 MiB is room
// for tens of thousands of ranks. A request over a size is answered with an error (ValueError in Python) and
// its connection closed; a set that would take the store past max_total_bytes with an error (RuntimeError).
struct StoreLimits {
    size_t max_key_bytes = size_t{4} << 10;
    size_t max_value_bytes = size_t{16} << 20;
    size_t max_total_bytes = size_t{256} << 20;         // keys + values + 128 bytes per entry
    size_t max_buffered_bytes = size_t{256} << 20;      // requests being read, replies being sent, parked keys
    int max_connections = 0;                            // 0: from RLIMIT_NOFILE (see DefaultMaxConnections)
    std::chrono::milliseconds handshake_timeout{5000};  // from accept to a valid token
    std::chrono::milliseconds stall_timeout{10000};     // a request or reply half-way that makes no progress

    // The largest request: one value and its key, or a wait naming many keys.
    size_t max_request_bytes() const { return max_value_bytes + max_key_bytes + (size_t{64} << 10); }
};

// The soft RLIMIT_NOFILE less a quarter (at least 64) for the rest of the process, within [16, 4096].
int DefaultMaxConnections();

class StoreServer;

class TcpStore {
public:
    // A client of the store at host:port; retries connecting until timeout. With serve, this process first
    // starts the server on port (0 picks a free one; port() says which), listening on host's address only
    // ("0.0.0.0" or "": every interface), then connects to it. token: the secret every client presents; without
    // one, $INFINITRAIN_STORE_TOKEN, and failing that a server makes a random one (token() says it) and a client
    // is refused. limits: the server's (a client checks its requests against them too).
    TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout,
             std::optional<std::string> token = std::nullopt, const StoreLimits& limits = {});
    ~TcpStore();
    TcpStore(const TcpStore&) = delete;
    TcpStore& operator=(const TcpStore&) = delete;

    void Set(const std::string& key, const std::string& value);
    std::string Get(const std::string& key);             // waits for the key
    int64_t Add(const std::string& key, int64_t delta);  // the value after adding (a missing key counts as 0)
    bool Check(const std::vector<std::string>& keys);    // whether all are set, without waiting
    void Wait(const std::vector<std::string>& keys);
    void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
    bool Delete(const std::string& key);  // whether it existed

    const std::string& host() const { return host_; }
    int port() const { return port_; }
    std::chrono::milliseconds timeout() const { return timeout_; }
    const std::string& token() const { return token_; }
    const StoreLimits& limits() const { return limits_; }

private:
    std::string Call(char cmd, const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                     const std::string& waiting_for);
    void Reconnect();

    std::string host_;
    int port_;
    std::chrono::milliseconds timeout_;
    std::string token_;
    StoreLimits limits_;
    std::unique_ptr<StoreServer> server_;
    std::mutex mu_;  // one request at a time on the connection
    int fd_ = -1;
};

}  // namespace infinitrain
