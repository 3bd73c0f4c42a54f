#include "router/kv_events_client.h"

#include <algorithm>
#include <cstdio>

#include "engine/kv_event_json.h"
#include "router/periodic_get.h"

namespace beluga::router {

namespace {

constexpr size_t kMaxPageBytes = size_t(256) << 20;  // a snapshot of a few million blocks
constexpr int kPageEvents = 4096;

}  // namespace

KvEventsClient::KvEventsClient(boost::asio::io_context& ioc, RouterContext& ctx)
    : ioc_(ioc), ctx_(ctx), stopped_(std::make_shared<std::atomic<bool>>(false)) {}

KvEventsClient::~KvEventsClient() {
  stop();
}

void KvEventsClient::start() {
  for (auto& r : ctx_.replicas) {
    Replica& replica = *r;
    RouterContext& ctx = ctx_;
    auto failures = std::make_shared<int>(0);
    start_periodic_get(
        ioc_, ctx_, replica, stopped_,
        [&ctx, &replica] {
          const KvIndex::Cursor cur = ctx.kv_index.cursor(replica.id());
          char epoch[17];
          std::snprintf(epoch, sizeof(epoch), "%016llx", static_cast<unsigned long long>(cur.epoch));
          // A snapshot may be large: its read gets longer than a health check.
          return GetRequest{"/v1/kv/events?epoch=" + std::string(epoch) +
                                "&after=" + std::to_string(cur.seq) + "&max=" + std::to_string(kPageEvents),
                            kMaxPageBytes, ctx.cfg.health_timeout_ms * 10, true};
        },
        [&ctx, &replica, failures](const GetResult& g) {
          std::optional<KvEventPage> page;
          if (g.ok && g.status == 200) page = parse_kv_event_page(g.body);
          if (page) {
            const int id = replica.id();
            ctx.kv_index.apply(id, *page);
            auto& c = replica.counters();
            c.kv_blocks.store(ctx.kv_index.blocks(id), std::memory_order_relaxed);
            c.kv_epochs.store(ctx.kv_index.epochs_seen(id), std::memory_order_relaxed);
            if (page->snapshot || !page->events.empty()) c.kv_pages.fetch_add(1, std::memory_order_relaxed);
            if (page->more) return 0;
          }
          // A failed read backs off 2x per failure up to 10 intervals: a replica still starting (or
          // one busy under load) is read again soon, one that is down is not polled hard.
          *failures = page ? 0 : std::min(*failures + 1, 4);
          const int factor = *failures == 0 ? 1 : std::min(10, 1 << (*failures - 1));
          return ctx.cfg.kv_events_interval_ms * factor;
        });
  }
}

void KvEventsClient::stop() {
  *stopped_ = true;
}

}  // namespace beluga::router
