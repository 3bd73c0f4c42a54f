#include "router/health_checker.h"

#include <nlohmann/json.hpp>

#include "router/periodic_get.h"

namespace beluga::router {

namespace {

// A decode engine's /health names where its KV transfers arrive (a wildcard host is reached at the
// engine's own host) and how full its KV cache is.
void learn_kv_address(Replica& replica, const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("kv_listen") || !j["kv_listen"].is_string())
    return replica.set_kv_address("");
  std::string a = j["kv_listen"].get<std::string>();
  for (const char* any : {"0.0.0.0:", "[::]:"})
    if (a.starts_with(any)) a = replica.address().host + a.substr(std::string_view(any).size() - 1);
  replica.set_kv_address(std::move(a));
  replica.kv_usage.store(
      j.contains("kv_usage") && j["kv_usage"].is_number() ? j["kv_usage"].get<double>() : 0.0,
      std::memory_order_relaxed);
}

}  // namespace

HealthChecker::HealthChecker(boost::asio::io_context& ioc, RouterContext& ctx)
    : ioc_(ioc), ctx_(ctx), stopped_(std::make_shared<std::atomic<bool>>(false)) {}

HealthChecker::~HealthChecker() {
  stop();
}

void HealthChecker::start() {
  for (auto& r : ctx_.replicas) {
    Replica& replica = *r;
    RouterContext& ctx = ctx_;
    start_periodic_get(
        ioc_, ctx_, replica, stopped_,
        [] {
          return GetRequest{"/health", 65536, 0, false};
        },
        [&ctx, &replica](const GetResult& g) {
          const bool ok = g.ok && g.status == 200;
          if (ok && replica.role() == ReplicaRole::kDecode) learn_kv_address(replica, g.body);
          if (ok) {
            if (replica.breaker().on_success()) ctx.on_rejoined(replica);
          } else {
            const std::string why = g.ok ? "GET /health answered " + std::to_string(g.status) : g.why;
            if (replica.breaker().on_failure()) ctx.on_ejected(replica, "health check: " + why);
          }
          return ctx.cfg.health_interval_ms;
        });
  }
}

void HealthChecker::stop() {
  *stopped_ = true;
}

}  // namespace beluga::router
