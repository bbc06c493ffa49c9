// A TCP key-value store for rendezvous: one process serves it (the launcher, or rank 0), every rank connects
// to it to exchange collective unique ids and addresses and to build barriers. Values are bytes; a get waits
// until its key is set, up to the store's timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace infinitrain {

// Raised when a wait outlasts the timeout; the message names the keys still missing.
class StoreTimeout : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class StoreServer;

class TcpStore {
public:
    // A client of the store at host:port; retries connecting until timeout. With serve, this process first
    // starts the server on port (0 picks a free one; port() says which) at host, then connects to it.
    TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout);
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

private:
    std::string Call(char cmd, const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                     const std::string& waiting_for);
    void Reconnect();

    std::string host_;
    int port_;
    std::chrono::milliseconds timeout_;
    std::unique_ptr<StoreServer> server_;
    std::mutex mu_;  // one request at a time on the connection
    int fd_ = -1;
};

}  // namespace infinitrain
