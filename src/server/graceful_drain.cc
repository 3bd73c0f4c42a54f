#include "server/graceful_drain.h"

#include <vector>

#include "server/session.h"

namespace beluga::server {

void GracefulDrain::add(Session* s, std::weak_ptr<Session> w) {
  std::lock_guard lock(mu_);
  sessions_[s] = std::move(w);
}

void GracefulDrain::remove(Session* s) {
  std::lock_guard lock(mu_);
  sessions_.erase(s);
}

void GracefulDrain::busy_delta(int d) {
  std::lock_guard lock(mu_);
  busy_ += d;
  if (busy_ == 0) cv_.notify_all();
}

void GracefulDrain::for_each_session(void (Session::*fn)()) {
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(mu_);
    for (auto& [p, w] : sessions_)
      if (auto s = w.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->post([s, fn] { (s.get()->*fn)(); });
}

bool GracefulDrain::finish(std::chrono::seconds grace) {
  for_each_session(&Session::on_drain);
  std::unique_lock lock(mu_);
  if (cv_.wait_for(lock, grace, [&] { return busy_ == 0; })) return true;
  lock.unlock();
  for_each_session(&Session::on_shutdown);
  lock.lock();
  // The cut requests' last words (error events, 503s) get a few seconds to reach their clients.
  cv_.wait_for(lock, std::chrono::seconds(5), [&] { return busy_ == 0; });
  return false;
}

}  // namespace beluga::server
