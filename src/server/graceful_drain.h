// Graceful shutdown's bookkeeping (Server::drain): the open sessions, how many of them are busy
// (building, generating or writing a response), and the drain itself. Once draining, idle
// connections close and busy ones close after their response; when the grace period ends, the
// requests still running are cut short. Thread-safe: sessions register and count themselves from
// their strands, drain() runs on the caller's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace beluga::server {

class Session;

class GracefulDrain {
 public:
  void add(Session* s, std::weak_ptr<Session> w);
  void remove(Session* s);
  // A session starts (+1) or stops (-1) being busy.
  void busy_delta(int d);
  bool draining() const { return draining_.load(); }

  // Marks the server draining (new requests then get 503); the caller stops accepting connections
  // next, then calls finish().
  void begin() { draining_ = true; }
  // Tells every session (Session::on_drain); waits up to `grace` for busy sessions to finish, then
  // cuts the rest short (Session::on_shutdown) and gives their last words a few seconds to go out.
  // True when everything finished within the grace period.
  bool finish(std::chrono::seconds grace);

 private:
  // Runs `fn` on every open session's strand.
  void for_each_session(void (Session::*fn)());

  std::mutex mu_;
  std::condition_variable cv_;  // signalled when busy_ drops to zero
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions_;
  int busy_ = 0;
  std::atomic<bool> draining_{false};
};

}  // namespace beluga::server
