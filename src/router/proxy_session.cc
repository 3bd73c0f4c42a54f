#include "router/proxy_session.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "router/cache_view.h"
#include "router/decode_balance.h"
#include "router/error_reply.h"
#include "router/http_headers.h"
#include "router/policy.h"
#include "router/prefill_call.h"
#include "util/log.h"

namespace beluga::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// How long a routing decision stands in for the replica's block events: two polls (the blocks appear
// in an event page only after the prompt is computed and the next poll reads them) and a margin.
int64_t recent_routing_ms(const RouterConfig& cfg) {
  return 2 * int64_t(cfg.kv_events_interval_ms) + 250;
}

std::string_view sv(beast::string_view s) {
  return std::string_view(s.data(), s.size());
}

bool stale_connection_error(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
         ec == net::error::broken_pipe;
}

constexpr size_t kPiece = 32 * 1024;      // bytes relayed per read
constexpr size_t kResponseIdScan = 8192;  // bytes of a Responses reply searched for its id
constexpr std::string_view kCrlf = "\r\n";
constexpr std::string_view kLastChunk = "0\r\n\r\n";

class ProxySession : public std::enable_shared_from_this<ProxySession> {
 public:
  ProxySession(tcp::socket&& socket, RouterContext& ctx)
      : ctx_(ctx), client_(std::move(socket)), exec_(client_.get_executor()) {}

  ~ProxySession() { end_attempt(); }

  void run() {
    net::dispatch(exec_, [self = shared_from_this()] { self->read_request(); });
  }

 private:
  // ------------------------------------------------------------------ the client's request

  void read_request() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(ctx_.cfg.max_body_bytes);
    parser_->header_limit(64 * 1024);
    // Between requests of a keep-alive connection the idle timeout applies; a new connection's
    // first request has the header timeout.
    client_.expires_after(std::chrono::seconds(served_ > 0 && cbuf_.size() == 0 ? ctx_.cfg.idle_timeout_s
                                                                                : ctx_.cfg.header_timeout_s));
    http::async_read_header(
        client_, cbuf_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    if (auto len = parser_->content_length(); len && *len > ctx_.cfg.max_body_bytes)
      return on_read_error(http::error::body_limit);
    const auto& req = parser_->get();
    auto expect = req.find(http::field::expect);
    if (expect != req.end() && beast::iequals(expect->value(), "100-continue")) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      return net::async_write(client_, net::buffer(kContinue.data(), kContinue.size()),
                              [self = shared_from_this()](beast::error_code ec, size_t) {
                                if (ec) return self->do_close();
                                self->read_body();
                              });
    }
    read_body();
  }

  void read_body() {
    client_.expires_after(std::chrono::seconds(ctx_.cfg.body_timeout_s));
    http::async_read(client_, cbuf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_request(ec); });
  }

  void on_read_error(beast::error_code ec) {
    keep_alive_ = false;
    if (ec == http::error::body_limit) {
      path_ = std::string(strip_query(parser_->get().target()));
      return reply(413, "application/json",
                   error_body(path_, 413,
                              "the request body is larger than the limit of " +
                                  std::to_string(ctx_.cfg.max_body_bytes) + " bytes"));
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
        ec == beast::error::timeout || ec == net::error::operation_aborted ||
        ec == http::error::partial_message)
      return do_close();
    reply(400, "application/json", error_body("", 400, "malformed HTTP request: " + ec.message()));
  }

  static std::string_view strip_query(beast::string_view t) {
    std::string_view target = sv(t);
    const size_t q = target.find('?');
    return q == std::string_view::npos ? target : target.substr(0, q);
  }

  void on_request(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    client_.expires_never();
    req_ = parser_->release();
    ++served_;
    keep_alive_ = req_.keep_alive();
    http11_ = req_.version() >= 11;
    path_ = std::string(strip_query(req_.target()));

    if (path_ == "/metrics")
      return reply(200, "text/plain; version=0.0.4; charset=utf-8",
                   ctx_.metrics.render(ctx_.replicas, ctx_.index.size()));
    if (path_ == "/health" || path_ == "/ready") {
      // The router is healthy (and ready) while at least one replica takes traffic.
      // Disaggregated: while a decode engine takes traffic (the prefill engines only speed it up);
      // decode_kv_known counts those whose KV address the health checks have learned.
      int up = 0, prefill_up = 0, kv_known = 0;
      for (const auto& r : ctx_.replicas) {
        const bool ok = r->breaker().allows_traffic();
        if (r->role() == ReplicaRole::kPrefill) {
          prefill_up += ok;
          continue;
        }
        up += ok;
        kv_known += ok && r->role() == ReplicaRole::kDecode && !r->kv_address().empty();
      }
      std::string body = std::string(R"({"status":")") + (up > 0 ? "ok" : "unavailable") +
                         R"(","replicas":)" + std::to_string(ctx_.replicas.size()) +
                         R"(,"replicas_available":)" + std::to_string(up + prefill_up);
      if (ctx_.disaggregated)
        body += R"(,"prefill_available":)" + std::to_string(prefill_up) + R"(,"decode_available":)" +
                std::to_string(up) + R"(,"decode_kv_known":)" + std::to_string(kv_known);
      body += "}";
      return reply(up > 0 ? 200 : 503, "application/json", body);
    }

    ctx_.metrics.request();
    route_ = req_.method() == http::verb::post ? generation_route(path_) : std::nullopt;
    hashes_.clear();
    prompt_tokens_ = 0;
    pinned_.clear();
    tried_ = 0;
    attempts_ = 0;
    last_error_.clear();
    last_timeout_ = false;
    prefill_leg_done_ = false;
    decode_target_ = nullptr;
    extra_headers_.clear();
    if (path_.starts_with("/v1/responses/")) pinned_ = path_.substr(14);

    const bool wants_key = ctx_.model && route_ &&
                           (ctx_.cfg.policy == Policy::kCacheAware || !ctx_.buckets.empty() ||
                            (*route_ == GenerationRoute::kResponses &&
                             req_.body().find("previous_response_id") != std::string::npos));
    if (!wants_key) return attempt();
    // Rendering and tokenizing a long prompt takes milliseconds: not on an I/O thread.
    net::post(*ctx_.tokenize_pool, [self = shared_from_this(), route = *route_] {
      PromptModel::Key key = self->ctx_.model->key(route, self->req_.body());
      net::post(self->exec_, [self, key = std::move(key)]() mutable { self->on_key(std::move(key)); });
    });
  }

  std::string presented_key() const {
    auto it = req_.find(http::field::authorization);
    if (it != req_.end()) {
      std::string_view v = sv(it->value());
      if (v.size() > 7 && header_iequals(v.substr(0, 7), "Bearer ")) return std::string(v.substr(7));
    }
    it = req_.find("x-api-key");
    if (it != req_.end()) return std::string(sv(it->value()));
    return {};
  }

  void on_key(PromptModel::Key key) {
    if (closed_) return;
    pinned_ = std::move(key.previous_response_id);
    prompt_tokens_ = int(key.tokens.size());
    // The replica's prefix-cache keys: the same chain, salted with the tenant's API key.
    if (ctx_.cfg.policy == Policy::kCacheAware)
      hashes_ =
          block_hashes(key.tokens, presented_key(), key.tokens.size() / size_t(ctx_.cfg.knobs.block_size));
    attempt();
  }

  // ------------------------------------------------------------------ picking a replica

  // Which replicas a leg may use: disaggregated, prefill engines take the prefill leg and decode
  // engines everything else; otherwise every replica takes everything.
  enum class Leg { kMain, kPrefill };
  bool eligible(const Replica& r, Leg leg) const {
    if (leg == Leg::kPrefill) return r.role() == ReplicaRole::kPrefill;
    return !ctx_.disaggregated || r.role() == ReplicaRole::kDecode;
  }

  Replica* select(Leg leg = Leg::kMain) {
    const size_t n = ctx_.replicas.size();
    candidates_.clear();
    for (size_t i = 0; i < n; ++i) {
      Replica& r = *ctx_.replicas[i];
      if (!eligible(r, leg) || !r.breaker().allows_traffic() || (tried_ >> i & 1)) continue;
      Candidate c{r.id(), r.in_flight.load(std::memory_order_relaxed), 0};
      c.kv_usage = r.kv_usage.load(std::memory_order_relaxed);
      candidates_.push_back(c);
    }
    if (candidates_.empty()) return nullptr;
    // The decode engine the prompt's KV was sent to, while it takes traffic.
    if (leg == Leg::kMain && decode_target_)
      for (const auto& c : candidates_)
        if (c.replica == decode_target_->id()) return decode_target_;
    matched_ = 0;
    if (!pinned_.empty()) {  // a stored response lives on one replica
      if (auto id = ctx_.responses.get(pinned_))
        for (const auto& c : candidates_)
          if (c.replica == *id) return ctx_.replicas[size_t(*id)].get();
    }
    const uint64_t ticket = ctx_.ticket.fetch_add(1, std::memory_order_relaxed);
    if (ctx_.disaggregated && leg == Leg::kMain && route_) {
      // A decode engine: by KV usage and requests in flight (decode_balance.h), the KV comes with the
      // request.
      return ctx_.replicas[size_t(candidates_[choose_decode(candidates_, ctx_.cfg.knobs, ticket)].replica)]
          .get();
    }
    if (!route_) {  // not a generation: the least loaded (round-robin under that policy)
      const Policy p = ctx_.cfg.policy == Policy::kRoundRobin ? Policy::kRoundRobin : Policy::kLeastLoad;
      return ctx_
          .replicas[size_t(candidates_[choose(p, candidates_, 0, ctx_.cfg.knobs, ticket).index].replica)]
          .get();
    }
    if (prompt_tokens_ > 0) keep_bucket(ctx_.buckets, prompt_tokens_, candidates_);
    if (!hashes_.empty())
      match_candidates(ctx_, hashes_, candidates_, matched_by_id_, recent_by_id_, now_ms(),
                       recent_routing_ms(ctx_.cfg));
    const Choice ch = choose(ctx_.cfg.policy, candidates_, prompt_tokens_, ctx_.cfg.knobs, ticket);
    ctx_.metrics.decision(ctx_.cfg.policy, ch.decision);
    matched_ = candidates_[ch.index].matched_blocks;
    return ctx_.replicas[size_t(candidates_[ch.index].replica)].get();
  }

  void attempt() {
    if (ctx_.disaggregated && route_ && !prefill_leg_done_) {
      prefill_leg_done_ = true;
      if (start_prefill()) return;  // on_prefilled() goes on
    }
    Replica* r = select();
    if (!r) {
      if (attempts_ == 0) {
        ctx_.metrics.unroutable();
        return reply(503, "application/json",
                     error_body(path_, 503,
                                "no replica is available (all " + std::to_string(ctx_.replicas.size()) +
                                    " are ejected); retry later"));
      }
      const int status = last_timeout_ ? 504 : 502;
      return reply(status, "application/json",
                   error_body(path_, status, "no replica could serve the request: " + last_error_));
    }
    replica_ = r;
    tried_ |= uint64_t(1) << r->id();
    ++attempts_;
    r->in_flight.fetch_add(1, std::memory_order_relaxed);
    r->counters().requests.fetch_add(1, std::memory_order_relaxed);
    if (route_ && ctx_.cfg.policy == Policy::kCacheAware && prompt_tokens_ > 0 && !ctx_.disaggregated) {
      r->counters().prompt_tokens.fetch_add(uint64_t(prompt_tokens_), std::memory_order_relaxed);
      r->counters().hit_tokens.fetch_add(uint64_t(matched_ * ctx_.cfg.knobs.block_size),
                                         std::memory_order_relaxed);
      ctx_.index.record(hashes_, r->id(), now_ms());
    }
    connect();
  }

  // ------------------------------------------------------------------ the prefill leg (disaggregated)

  // Picks the decode engine, then a prefill engine, and sends it the request to prefill for the
  // decode engine. False when the request goes to a decode engine alone (it then computes the
  // prompt itself: a stored response's continuation, no prefill engine up, the decode engine's KV
  // address not known yet).
  bool start_prefill() {
    if (!pinned_.empty()) {  // the stored response lives on a decode engine, which has its KV
      ctx_.metrics.prefill(PrefillResult::kSkipped, 0);
      return false;
    }
    Replica* d = select(Leg::kMain);
    const std::string kv = d ? d->kv_address() : std::string();
    Replica* p = kv.empty() ? nullptr : select(Leg::kPrefill);
    if (!p) {
      ctx_.metrics.prefill(PrefillResult::kSkipped, 0);
      return false;
    }
    decode_target_ = d;
    prefill_replica_ = p;
    p->in_flight.fetch_add(1, std::memory_order_relaxed);
    p->counters().requests.fetch_add(1, std::memory_order_relaxed);
    if (ctx_.cfg.policy == Policy::kCacheAware && prompt_tokens_ > 0) {
      p->counters().prompt_tokens.fetch_add(uint64_t(prompt_tokens_), std::memory_order_relaxed);
      p->counters().hit_tokens.fetch_add(uint64_t(matched_ * ctx_.cfg.knobs.block_size),
                                         std::memory_order_relaxed);
      ctx_.index.record(hashes_, p->id(), now_ms());
    }
    prefill_ = PrefillCall::start(
        exec_, ctx_.endpoints[size_t(p->id())], p->address(), req_, kv, ctx_.cfg.connect_timeout_ms,
        ctx_.cfg.upstream_timeout_s,
        [self = shared_from_this()](PrefillOutcome o) { self->on_prefilled(std::move(o)); });
    arm_watch();  // notice a client that leaves while the prompt is computed
    return true;
  }

  void on_prefilled(PrefillOutcome o) {
    prefill_.reset();
    Replica* p = prefill_replica_;
    prefill_replica_ = nullptr;
    p->in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (client_gone_) return abandon();
    if (o.ok) {
      if (p->breaker().on_success()) ctx_.on_rejoined(*p);
      extra_headers_ = "x-beluga-prefill-cached: " + o.cached + "\r\n";
      ctx_.metrics.prefill(PrefillResult::kOk, o.seconds);
    } else {
      // The decode engine computes the prompt itself: the same answer, later. An engine that did not
      // answer is charged (a refusal, e.g. a bad request, is not its fault: the decode engine says so).
      p->counters().failures.fetch_add(1, std::memory_order_relaxed);
      if (!o.reached && p->breaker().on_failure()) ctx_.on_ejected(*p, "prefill: " + o.error);
      ctx_.metrics.prefill(PrefillResult::kFailed, o.seconds);
    }
    attempt();
  }

  // Ends the current attempt's hold on its replica.
  void end_attempt() {
    if (!replica_) return;
    replica_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    replica_ = nullptr;
  }

  // ------------------------------------------------------------------ upstream

  void connect() {
    up_.emplace(exec_);
    ubuf_.clear();
    const auto& eps = ctx_.endpoints[size_t(replica_->id())];
    const int fd = replica_->take_idle();
    if (fd >= 0) {
      beast::error_code ec;
      up_->socket().assign(eps.front().protocol(), fd, ec);
      if (!ec) {
        reused_ = true;
        return send_upstream();
      }
      ::close(fd);
    }
    reused_ = false;
    up_->expires_after(std::chrono::milliseconds(ctx_.cfg.connect_timeout_ms));
    up_->async_connect(eps, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->attempt_failed("connect: " + ec.message(), ec == beast::error::timeout);
      beast::error_code ignored;
      self->up_->socket().set_option(tcp::no_delay(true), ignored);
      self->send_upstream();
    });
  }

  void send_upstream() {
    if (client_gone_) return abandon();
    const ReplicaAddress& a = replica_->address();
    up_head_.clear();
    up_head_ += sv(req_.method_string());
    up_head_ += ' ';
    up_head_ += sv(req_.target());
    up_head_ += " HTTP/1.1\r\nHost: ";
    up_head_ += a.host;
    up_head_ += ':';
    up_head_ += a.port;
    up_head_ += kCrlf;
    for (const auto& f : req_) {
      if (hop_by_hop(sv(f.name_string())) || internal_header(sv(f.name_string()))) continue;
      up_head_ += sv(f.name_string());
      up_head_ += ": ";
      up_head_ += sv(f.value());
      up_head_ += kCrlf;
    }
    up_head_ += extra_headers_;
    if (!req_.body().empty() || req_.method() == http::verb::post || req_.method() == http::verb::put) {
      up_head_ += "Content-Length: ";
      up_head_ += std::to_string(req_.body().size());
      up_head_ += kCrlf;
    }
    up_head_ += kCrlf;
    const std::array<net::const_buffer, 2> bufs{net::buffer(up_head_), net::buffer(req_.body())};
    up_->expires_after(std::chrono::seconds(30));
    net::async_write(*up_, bufs, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->upstream_error(ec, "sending the request");
      self->read_upstream_header();
    });
    arm_watch();  // notice a client that leaves while the replica works
  }

  void read_upstream_header() {
    if (client_gone_) return abandon();
    rp_.emplace();
    rp_->body_limit(std::numeric_limits<std::uint64_t>::max());
    rp_->header_limit(64 * 1024);
    if (req_.method() == http::verb::head) rp_->skip(true);  // its Content-Length announces no body here
    up_->expires_after(std::chrono::seconds(ctx_.cfg.upstream_timeout_s));
    http::async_read_header(*up_, ubuf_, *rp_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_upstream_header(ec);
    });
  }

  // A failure talking to the replica before the client got anything.
  void upstream_error(beast::error_code ec, const char* doing) {
    if (client_gone_) return abandon();
    if (reused_ && stale_connection_error(ec) && ubuf_.size() == 0) {
      // The idle keep-alive connection had been closed by the replica: a fresh one, same replica.
      reused_ = false;
      up_.reset();
      return connect_fresh();
    }
    attempt_failed(std::string(doing) + ": " + ec.message(), ec == beast::error::timeout);
  }

  void connect_fresh() {
    replica_->drop_idle();  // its other idle connections are likely stale too
    connect();
  }

  void on_upstream_header(beast::error_code ec) {
    if (ec) return upstream_error(ec, "reading the response");
    if (client_gone_) return abandon();
    const unsigned status = rp_->get().result_int();
    // Overloaded or going away (draining, loading): another replica may take it. Not a breaker
    // failure: the replica answered, and its health check says whether it is down.
    if ((status == 503 || status == 429) && can_retry()) {
      replica_->counters().retries.fetch_add(1, std::memory_order_relaxed);
      ctx_.metrics.retry();
      last_error_ = replica_->address().url + " answered " + std::to_string(status);
      log::debug("router", path_, ": ", last_error_, "; retrying on another replica");
      close_upstream();
      end_attempt();
      return attempt();
    }
    if (replica_->breaker().on_success()) ctx_.on_rejoined(*replica_);

    const auto& res = rp_->get();
    head_.clear();
    head_ += "HTTP/1.1 ";
    head_ += std::to_string(status);
    head_ += ' ';
    head_ += sv(res.reason().empty() ? http::obsolete_reason(res.result()) : res.reason());
    head_ += kCrlf;
    sse_ = false;
    for (const auto& f : res) {
      if (hop_by_hop(sv(f.name_string()))) continue;
      if (f.name() == http::field::content_type && sv(f.value()).starts_with("text/event-stream"))
        sse_ = true;
      head_ += sv(f.name_string());
      head_ += ": ";
      head_ += sv(f.value());
      head_ += kCrlf;
    }
    chunked_out_ = false;
    if (auto len = rp_->content_length()) {
      head_ += "Content-Length: " + std::to_string(*len) + "\r\n";
    } else if (rp_->is_done()) {
      if (status != 204 && status != 304) head_ += "Content-Length: 0\r\n";
    } else if (http11_) {
      chunked_out_ = true;
      head_ += "Transfer-Encoding: chunked\r\n";
    } else {
      keep_alive_ = false;  // HTTP/1.0: the body ends with the connection
    }
    head_ += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    head_pending_ = true;
    if (piece_.empty()) piece_.resize(kPiece);  // not before: an idle connection holds no relay buffer
    scan_.clear();
    scan_id_ = path_ == "/v1/responses" && status == 200;
    // The head goes out with the first body bytes: until then, the request can still be retried.
    relay_body();
  }

  void relay_body() {
    if (client_gone_) return abandon();
    if (rp_->is_done()) return write_piece(0, true);
    auto& body = rp_->get().body();
    body.data = piece_.data();
    body.size = piece_.size();
    up_->expires_after(std::chrono::seconds(ctx_.cfg.upstream_timeout_s));
    http::async_read_some(*up_, ubuf_, *rp_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_piece(ec); });
  }

  void on_piece(beast::error_code ec) {
    if (ec == http::error::need_buffer) ec = {};
    if (client_gone_) return abandon();
    size_t got = piece_.size() - rp_->get().body().size;
    if (ec) {
      // Nothing has reached the client yet (the head waits for the first body bytes): retryable.
      if (head_pending_)
        return attempt_failed("reading the response: " + ec.message(), ec == beast::error::timeout);
      return stream_broken(ec.message());
    }
    got += parse_buffered(got);
    if (got == 0 && !rp_->is_done()) return relay_body();
    if (scan_id_) {
      scan_.append(piece_.data(), std::min(got, kResponseIdScan - std::min(kResponseIdScan, scan_.size())));
      std::string id = find_response_id(scan_);
      if (!id.empty()) {
        ctx_.responses.put(id, replica_->id());
        scan_id_ = false;
      } else if (scan_.size() >= kResponseIdScan) {
        scan_id_ = false;
      }
    }
    write_piece(got, rp_->is_done());
  }

  // More of the body may already sit in ubuf_ (a replica streaming faster than one event per read):
  // it is parsed into the rest of piece_ now, so that one write carries all of it. Returns the body
  // bytes added after piece_[0..have).
  size_t parse_buffered(size_t have) {
    size_t added = 0;
    while (!rp_->is_done() && ubuf_.size() > 0 && have + added < piece_.size()) {
      auto& body = rp_->get().body();
      const size_t room = piece_.size() - have - added;
      body.data = piece_.data() + have + added;
      body.size = room;
      beast::error_code ec;
      const size_t used = rp_->put(ubuf_.data(), ec);
      ubuf_.consume(used);
      added += room - body.size;
      if (ec == http::error::need_buffer) ec = {};
      if (ec || used == 0) break;  // need_more: the next read brings the rest; an error: it reports again
    }
    return added;
  }

  // Sends the head (if still pending), `n` bytes of piece_ and, when `last`, the end of the body.
  void write_piece(size_t n, bool last) {
    auto& bufs = wbufs_;  // a member: the write refers to it until it completes
    size_t k = 0;
    if (head_pending_) bufs[k++] = net::buffer(head_);
    if (n > 0) {
      if (chunked_out_) {
        const int len = std::snprintf(chunk_size_.data(), chunk_size_.size(), "%zx\r\n", n);
        bufs[k++] = net::buffer(chunk_size_.data(), size_t(len));
      }
      bufs[k++] = net::buffer(piece_.data(), n);
      if (chunked_out_) bufs[k++] = net::buffer(kCrlf.data(), kCrlf.size());
    }
    if (last && chunked_out_) bufs[k++] = net::buffer(kLastChunk.data(), kLastChunk.size());
    head_pending_ = false;
    client_.expires_after(std::chrono::seconds(120));  // a client that stops reading is dropped
    net::async_write(client_, std::span(bufs.data(), k),
                     [self = shared_from_this(), last](beast::error_code ec, size_t) {
                       self->client_.expires_never();
                       if (ec) return self->client_left();
                       if (last) return self->finish_upstream();
                       self->relay_body();
                     });
  }

  // The replica broke a response off after the client got part of it.
  void stream_broken(const std::string& why) {
    Replica* r = replica_;
    r->counters().stream_errors.fetch_add(1, std::memory_order_relaxed);
    r->counters().failures.fetch_add(1, std::memory_order_relaxed);
    if (r->breaker().on_failure()) ctx_.on_ejected(*r, "stream broken off: " + why);
    close_upstream();
    end_attempt();
    keep_alive_ = false;
    if (!sse_) return do_close();  // nothing to say inside a JSON body: the client sees it cut short
    tail_ = stream_error_events(path_, "the replica " + r->address().url + " failed mid-stream: " + why);
    if (chunked_out_) {
      char hex[24];
      const int len = std::snprintf(hex, sizeof(hex), "%zx\r\n", tail_.size());
      tail_ = std::string(hex, size_t(len)) + tail_ + "\r\n" + std::string(kLastChunk);
    }
    net::async_write(client_, net::buffer(tail_),
                     [self = shared_from_this()](beast::error_code, size_t) { self->do_close(); });
  }

  bool can_retry() const {
    if (attempts_ > ctx_.cfg.max_retries) return false;
    for (size_t i = 0; i < ctx_.replicas.size(); ++i)
      if (!(tried_ >> i & 1) && ctx_.replicas[i]->breaker().allows_traffic()) return true;
    return false;
  }

  // The attempt failed before the client got a byte: the replica is charged, and the request goes to
  // another one while retries last.
  void attempt_failed(const std::string& why, bool timeout) {
    if (client_gone_) return abandon();
    Replica* r = replica_;
    close_upstream();
    end_attempt();
    r->counters().failures.fetch_add(1, std::memory_order_relaxed);
    if (r->breaker().on_failure()) ctx_.on_ejected(*r, why);
    last_error_ = r->address().url + ": " + why;
    last_timeout_ = timeout;
    if (can_retry()) {
      r->counters().retries.fetch_add(1, std::memory_order_relaxed);
      ctx_.metrics.retry();
      log::debug("router", path_, ": ", last_error_, "; retrying on another replica");
      return attempt();
    }
    const int status = timeout ? 504 : 502;
    log::warn("router", path_, " failed with ", status, ": ", last_error_);
    reply(status, "application/json", error_body(path_, status, "the replica failed: " + last_error_));
  }

  void finish_upstream() {
    if (rp_ && rp_->is_done() && rp_->keep_alive() && up_ && ubuf_.size() == 0) {
      beast::error_code ec;
      up_->expires_never();
      const int fd = up_->release_socket().release(ec);
      if (!ec) replica_->put_idle(fd);
    }
    close_upstream();
    end_attempt();
    after_response();
  }

  void close_upstream() {
    if (!up_) return;
    beast::error_code ignored;
    if (up_->socket().is_open()) up_->socket().close(ignored);
    up_.reset();
  }

  // ------------------------------------------------------------------ the client going away

  // While the replica works, a read on the client's socket says when the client closes it.
  void arm_watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    client_.socket().async_read_some(
        cbuf_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (!ec) cbuf_.commit(n);
    if (resume_after_watch_) {
      resume_after_watch_ = false;
      if (ec && ec != net::error::operation_aborted) return do_close();
      return read_request();
    }
    if (!replica_ && !prefill_) return;  // the response ended meanwhile (after_response reads on)
    if (ec || cbuf_.size() > ctx_.cfg.max_body_bytes + 65536) return client_left();
    arm_watch();
  }

  // The client closed its connection (or a write to it failed): the upstream connection closes too,
  // which makes the replica abort the request.
  void client_left() {
    client_gone_ = true;
    if (prefill_) return prefill_->cancel();  // its callback abandons
    close_upstream();  // a pending upstream operation completes with an error and calls abandon()
    abandon();
  }

  void abandon() {
    end_attempt();
    close_upstream();
    do_close();
  }

  // ------------------------------------------------------------------ the router's own replies

  void reply(int status, std::string_view content_type, const std::string& body) {
    out_ = "HTTP/1.1 " + std::to_string(status) + " " +
           std::string(sv(http::obsolete_reason(http::int_to_status(unsigned(status))))) +
           "\r\nServer: beluga-router\r\nContent-Type: " + std::string(content_type) +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
           (keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n") + body;
    client_.expires_after(std::chrono::seconds(120));
    net::async_write(client_, net::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->client_.expires_never();
      if (ec) return self->do_close();
      self->after_response();
    });
  }

  void after_response() {
    if (!keep_alive_ || closed_ || client_gone_) return do_close();
    if (watching_) {  // the watch read is cancelled; its handler reads the next request
      resume_after_watch_ = true;
      beast::error_code ec;
      client_.socket().cancel(ec);
      return;
    }
    read_request();
  }

  void do_close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    client_.socket().shutdown(tcp::socket::shutdown_both, ec);
    client_.socket().close(ec);
  }

  RouterContext& ctx_;
  beast::tcp_stream client_;
  const net::any_io_executor exec_;
  beast::flat_buffer cbuf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  std::string path_;
  uint64_t served_ = 0;
  bool keep_alive_ = true, http11_ = true, closed_ = false;
  bool watching_ = false, resume_after_watch_ = false, client_gone_ = false;

  // Routing the request.
  std::optional<GenerationRoute> route_;
  std::vector<BlockHash> hashes_;
  int prompt_tokens_ = 0;
  std::string pinned_;  // a Responses id whose replica the request should reach
  std::vector<Candidate> candidates_;
  std::vector<int> matched_by_id_, recent_by_id_;
  int matched_ = 0;
  uint64_t tried_ = 0;  // bit per replica id
  int attempts_ = 0;
  std::string last_error_;
  bool last_timeout_ = false;

  // Disaggregated: the prefill leg (done or skipped), the decode engine holding the KV, the headers
  // the decode leg adds.
  bool prefill_leg_done_ = false;
  Replica* decode_target_ = nullptr;
  Replica* prefill_replica_ = nullptr;
  std::shared_ptr<PrefillCall> prefill_;
  std::string extra_headers_;

  // The attempt in progress.
  Replica* replica_ = nullptr;
  std::optional<beast::tcp_stream> up_;
  bool reused_ = false;  // up_ came from the replica's idle connections
  std::string up_head_;
  beast::flat_buffer ubuf_;
  std::optional<http::response_parser<http::buffer_body>> rp_;
  std::vector<char> piece_;
  std::array<char, 24> chunk_size_{};
  std::array<net::const_buffer, 5> wbufs_;
  std::string head_, tail_, out_, scan_;
  bool head_pending_ = false, chunked_out_ = false, sse_ = false, scan_id_ = false;
};

}  // namespace

void start_proxy_session(tcp::socket socket, RouterContext& ctx) {
  std::make_shared<ProxySession>(std::move(socket), ctx)->run();
}

}  // namespace beluga::router
