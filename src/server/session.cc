#include "server/session.h"

#include <array>

#include "server/access_log.h"
#include "server/auth.h"
#include "server/internal_error.h"
#include "server/kv_events_route.h"
#include "server/sse.h"
#include "server/utility_routes.h"
#include "server/web_ui.h"
#include "util/log.h"

namespace beluga::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Json = nlohmann::ordered_json;

namespace {

std::string_view sv(beast::string_view s) {
  return std::string_view(s.data(), s.size());
}

std::string_view strip_query(beast::string_view t) {
  std::string_view target = sv(t);
  size_t q = target.find('?');
  return q == std::string_view::npos ? target : target.substr(0, q);
}

// The API whose error shape a path answers in.
recipe::Api api_of_path(std::string_view path) {
  if (path.starts_with("/v1/messages")) return recipe::Api::kMessages;
  if (path.starts_with("/v1/responses")) return recipe::Api::kResponses;
  return recipe::Api::kChat;
}

std::optional<ServerApi> generation_route(std::string_view path) {
  if (path == "/v1/chat/completions") return ServerApi::kChat;
  if (path == "/v1/completions") return ServerApi::kCompletions;
  if (path == "/v1/responses") return ServerApi::kResponses;
  if (path == "/v1/messages") return ServerApi::kMessages;
  return std::nullopt;
}

bool is_disconnect(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
         ec == net::error::broken_pipe || ec == beast::error::timeout ||
         ec == net::error::operation_aborted || ec == net::error::bad_descriptor ||
         ec == http::error::partial_message;
}

}  // namespace

Session::Session(tcp::socket&& socket, Server::State& st)
    : st_(st), stream_(std::move(socket)), exec_(stream_.get_executor()) {
  st_.connections.fetch_add(1);
  st_.metrics.connections(+1);
}

Session::~Session() {
  if (counted_busy_) st_.drain.busy_delta(-1);
  st_.drain.remove(this);
  st_.connections.fetch_sub(1);
  st_.metrics.connections(-1);
}

void Session::run() {
  st_.drain.add(this, weak_from_this());
  net::dispatch(exec_, [self = shared_from_this()] { self->do_read(); });
}

void Session::on_drain() {
  if (idle_wait_) do_close();
}

void Session::on_shutdown() {
  shutting_down_ = true;
  if (gen_.building() || gen_.active())
    end_with_error(error_api(gen_.api()), 503, "the server is shutting down; the request was cut short");
}

// ------------------------------------------------------------------ reading requests

// Between requests of a keep-alive connection: wait (up to the idle timeout) for the next
// request's first byte; from there (and on a new connection, from its opening) the headers have
// header_timeout_s to arrive.
void Session::do_read() {
  if (closed_) return;
  if (served_ > 0 && buffer_.size() == 0) {
    if (st_.drain.draining()) return do_close();
    stream_.expires_after(std::chrono::seconds(st_.cfg.idle_timeout_s));
    auto mb = buffer_.prepare(4096);
    idle_wait_ = true;
    stream_.async_read_some(mb, [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->idle_wait_ = false;
      if (ec) return self->do_close();
      self->buffer_.commit(n);
      self->read_header();
    });
    return;
  }
  read_header();
}

void Session::read_header() {
  if (closed_) return;
  head_sent_ = false;
  access_method_.clear();
  access_path_.clear();
  parser_.emplace();
  parser_->body_limit(st_.cfg.max_body_bytes);
  parser_->header_limit(64 * 1024);
  stream_.expires_after(std::chrono::seconds(st_.cfg.header_timeout_s));
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Session::on_header(beast::error_code ec) {
  if (ec) return on_read_error(ec);
  const auto& req = parser_->get();
  access_start_ = std::chrono::steady_clock::now();
  if (access_client_.empty()) {  // once per connection, while the peer is surely there
    beast::error_code aec;
    auto ep = stream_.socket().remote_endpoint(aec);
    access_client_ = aec ? "-" : ep.address().to_string();
  }
  access_method_ = std::string(sv(req.method_string()));
  access_path_ = std::string(strip_query(req.target()));
  if (auto len = parser_->content_length(); len && *len > st_.cfg.max_body_bytes)
    return on_read_error(http::error::body_limit);
  auto expect = req.find(http::field::expect);
  if (expect != req.end() && beast::iequals(expect->value(), "100-continue")) {
    // Tell the client to send the body (curl waits for this on large bodies).
    auto msg = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    net::async_write(stream_, net::buffer(*msg),
                     [self = shared_from_this(), msg](beast::error_code ec, size_t) {
                       if (ec) return self->do_close();
                       self->read_body();
                     });
    return;
  }
  read_body();
}

void Session::read_body() {
  stream_.expires_after(std::chrono::seconds(st_.cfg.body_timeout_s));
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
}

void Session::on_read_error(beast::error_code ec) {
  if (ec == http::error::body_limit) {
    // The start line is parsed even when the header check fails (Beast checks Content-Length there).
    std::string path(strip_query(parser_->get().target()));
    keep_alive_ = false;
    drain_on_close_ = true;  // let the client finish sending, so it reads the 413 instead of a reset
    return send_error(
        api_of_path(path), 413,
        "the request body is larger than the limit of " + std::to_string(st_.cfg.max_body_bytes) + " bytes",
        "request");
  }
  if (is_disconnect(ec)) return do_close();
  // Malformed HTTP: answer 400 and close.
  keep_alive_ = false;
  send_error(recipe::Api::kChat, 400, std::string("malformed HTTP request: ") + ec.message(), "request");
}

void Session::on_read(beast::error_code ec) {
  if (ec) return on_read_error(ec);
  stream_.expires_never();
  http::request<http::string_body> req = parser_->release();
  ++served_;
  keep_alive_ = req.keep_alive() && !st_.drain.draining();
  http11_ = req.version() >= 11;
  const recipe::Api eapi = api_of_path(strip_query(req.target()));
  try {
    route(req);
  } catch (const std::exception& e) {
    fail_internal(eapi, e.what());
  } catch (...) {
    fail_internal(eapi, "unknown exception");
  }
}

// A handler threw (a bug or a failed allocation, not the client's fault): the request gets a 500
// naming a logged id.
void Session::fail_internal(recipe::Api eapi, std::string_view what) noexcept {
  try {
    end_with_error(eapi, 500, report_internal_error(label_, what));
  } catch (...) {
    do_close();  // out of memory while reporting: at least the client sees the connection end
  }
}

// Ends the request in whatever state it is: its engine requests are aborted, a stream whose head
// went out gets the API's error event and its end, anything else an error response. The
// connection closes after the reply, since the request may have been left half-way.
void Session::end_with_error(recipe::Api eapi, int status, const std::string& msg) {
  keep_alive_ = false;
  const bool stream_open = head_sent_ && gen_.stream_mode();
  const std::string out = gen_.cut_short(msg, stream_open);
  if (stream_open) {
    if (!out.empty()) queue_body(out);
    if (http11_) queue_raw(http_chunk(""));
    st_.metrics.request_done(label_, status);
    end_response();
  } else if (head_sent_) {  // a reply is already on its way: end the connection after it
    end_response();
  } else {
    send_error(eapi, status, msg, "");
  }
  sync_busy();
}

// Counts this session as busy (GracefulDrain) while it builds, generates or writes.
void Session::sync_busy() {
  const bool b = gen_.building() || gen_.active() || writing_;
  if (b == counted_busy_) return;
  counted_busy_ = b;
  st_.drain.busy_delta(b ? +1 : -1);
}

// ------------------------------------------------------------------ routing

std::string Session::presented_key(const Request& req) {
  auto it = req.find(http::field::authorization);
  if (it != req.end()) {
    std::string_view v = sv(it->value());
    if (v.size() > 7 && beast::iequals(it->value().substr(0, 7), "Bearer ")) return std::string(v.substr(7));
  }
  it = req.find("x-api-key");
  if (it != req.end()) return std::string(it->value());
  return {};
}

void Session::route(Request& req) {
  const std::string path(strip_query(req.target()));
  const auto method = req.method();
  const recipe::Api eapi = api_of_path(path);
  label_ = "other";

  if (path == "/health" || path == "/ping") {
    // Liveness: the process serves HTTP and the engine makes progress without failing.
    label_ = "health";
    if (!st_.ready) return send_response(503, "application/json", R"({"status":"loading"})");
    const HealthVerdict v = st_.engine_verdict();
    if (!v.ok) return send_json(503, Json{{"status", "unhealthy"}, {"reason", v.reason}});
    if (st_.info.pd.role == ServeRole::kBoth)
      return send_response(200, "application/json", R"({"status":"ok"})");
    Json h{{"status", "ok"}, {"role", serve_role_name(st_.info.pd.role)}};
    if (!st_.info.pd.kv_address.empty()) h["kv_listen"] = st_.info.pd.kv_address;
    // The router's decode balancer weighs this (router/decode_balance.h).
    const auto es = st_.engine->stats();
    h["kv_usage"] = es.kv_blocks_total > 0 ? double(es.kv_blocks_used) / double(es.kv_blocks_total) : 0.0;
    return send_json(200, h);
  }
  if (path == "/ready") {
    // Readiness: take new requests here (not while loading, draining or unhealthy).
    label_ = "health";
    if (!st_.ready) return send_response(503, "application/json", R"({"status":"loading"})");
    if (st_.drain.draining()) return send_response(503, "application/json", R"({"status":"draining"})");
    const HealthVerdict v = st_.engine_verdict();
    if (!v.ok) return send_json(503, Json{{"status", "unhealthy"}, {"reason", v.reason}});
    return send_response(200, "application/json", R"({"status":"ready"})");
  }
  if (path == "/metrics") {
    label_ = "metrics";
    std::optional<EngineStats> stats;
    if (st_.ready) stats = st_.engine->stats();
    return send_response(200, "text/plain; version=0.0.4; charset=utf-8",
                         st_.metrics.render(stats ? &*stats : nullptr, st_.info.served_name) +
                             (st_.ready && st_.info.extra_metrics ? st_.info.extra_metrics() : ""));
  }
  if (auto page = web_asset(path)) {  // the web chat page (web_ui.h); public: it asks for the key itself
    label_ = "web";
    if (method != http::verb::get) return send_error(eapi, 405, "use GET for " + path, "");
    return send_response(200, page->content_type, page->body);
  }
  if (!path.starts_with("/v1/") && !is_utility_route(path))
    return send_error(eapi, 404, "no route for " + path, "");

  if (!st_.cfg.api_key.empty() && !api_key_matches(presented_key(req), st_.cfg.api_key))
    return send_error(
        eapi, 401, "invalid or missing API key (send `Authorization: Bearer KEY` or `x-api-key: KEY`)", "");

  if (is_utility_route(path)) {  // /tokenize, /detokenize, /v1/messages/count_tokens, /version
    label_ = path == "/version" ? "version" : path.substr(path.rfind('/') + 1);
    auto r = handle_utility_route(path, sv(req.method_string()), req.body(), st_.ready ? &st_.info : nullptr);
    return send_response(r.status, r.content_type, r.body);
  }
  if (path == kKvEventsPath) {
    label_ = "kv_events";
    auto r = handle_kv_events_route(sv(req.target()), sv(req.method_string()),
                                    st_.ready ? st_.info.kv_events : nullptr, st_.ready);
    return send_response(r.status, r.content_type, r.body);
  }
  if (path == "/v1/models" || path.starts_with("/v1/models/")) {
    label_ = "models";
    if (method != http::verb::get) return send_error(eapi, 405, "use GET for " + path, "");
    if (!st_.ready) return send_error(eapi, 503, "the model is loading", "");
    Json model{{"id", st_.info.served_name},
               {"object", "model"},
               {"type", "model"},
               {"created", st_.started},
               {"created_at", "1970-01-01T00:00:00Z"},
               {"display_name", st_.info.served_name},
               {"owned_by", "beluga"},
               {"max_model_len", st_.info.max_model_len}};
    if (path == "/v1/models") {
      return send_response(200, "application/json",
                           dump_json(Json{{"object", "list"},
                                          {"data", Json::array({model})},
                                          {"has_more", false},
                                          {"first_id", st_.info.served_name},
                                          {"last_id", st_.info.served_name}}));
    }
    if (path.substr(11) != st_.info.served_name)
      return send_error(eapi, 404, "The model `" + path.substr(11) + "` does not exist.", "model");
    return send_response(200, "application/json", dump_json(model));
  }

  if (path.starts_with("/v1/responses/")) return handle_stored_response(req, path.substr(14));

  auto api = generation_route(path);
  if (!api) return send_error(eapi, 404, "no route for " + path, "");
  label_ = server_api_name(*api);
  if (method != http::verb::post) return send_error(eapi, 405, "use POST for " + path, "");
  if (!st_.ready) return send_error(eapi, 503, "the model is loading", "");
  if (st_.drain.draining()) return send_error(eapi, 503, "the server is shutting down", "");
  std::string pd_error;
  PdRequest pd = pd_request(st_.info.pd, sv(req[kPrefillToHeader]), sv(req[kPrefillCachedHeader]), &pd_error);
  if (!pd_error.empty()) return send_error(eapi, 400, pd_error, "");
  gen_.start(*api, presented_key(req), std::string(req["x-traffic-class"]), std::move(pd),
             std::move(req.body()));
}

// GET / DELETE /v1/responses/{id}: only the tenant that created a response sees it.
void Session::handle_stored_response(const Request& req, const std::string& id) {
  const recipe::Api eapi = recipe::Api::kResponses;
  label_ = "responses";
  if (id.empty() || id.find('/') != std::string::npos)
    return send_error(eapi, 404, "no route for /v1/responses/" + id, "");
  const auto not_found = [&] { send_error(eapi, 404, "Response with id '" + id + "' not found.", ""); };
  if (req.method() == http::verb::get) {
    auto r = st_.responses->get(id, presented_key(req));
    if (!r) return not_found();
    return send_json(200, r->response);
  }
  if (req.method() == http::verb::delete_) {
    if (!st_.responses->erase(id, presented_key(req))) return not_found();
    return send_json(200, Json{{"id", id}, {"object", "response"}, {"deleted", true}});
  }
  send_error(eapi, 405, "use GET or DELETE for /v1/responses/" + id, "");
}

// ------------------------------------------------------------------ generation

// What a build task hands back to the session's strand.
struct Built {
  std::optional<BuiltRequest> request;
  std::optional<recipe::ApiError> client_error;  // the request is invalid
  std::string internal_error;                    // not empty: a bug while building
};

// Parsing, templating and tokenizing run on the build pool; the result comes back to this strand.
void Session::on_client_gone() {
  gen_.on_client_gone();
  do_close();
  sync_busy();
}

// While generating, a read on the socket tells us when the client closes the connection.
void Session::arm_watch() {
  if (watching_ || closed_) return;
  watching_ = true;
  auto mb = buffer_.prepare(4096);
  stream_.socket().async_read_some(
      mb, [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
}

void Session::on_watch(beast::error_code ec, size_t n) {
  watching_ = false;
  if (!ec) buffer_.commit(n);
  if (resume_after_watch_) {
    resume_after_watch_ = false;
    if (ec && ec != net::error::operation_aborted) return do_close();
    return do_read();
  }
  if (gen_.building()) {
    if (ec)
      gen_.mark_client_gone();  // the build's result closes
    else if (buffer_.size() > st_.cfg.max_body_bytes + 65536)
      gen_.mark_client_gone();
    else
      arm_watch();
    return;
  }
  if (gen_.active()) {
    if (ec) return on_client_gone();
    if (buffer_.size() > st_.cfg.max_body_bytes + 65536) return on_client_gone();  // pipelining abuse
    return arm_watch();
  }
  if (ec && ec != net::error::operation_aborted) keep_alive_ = false;
}

// ------------------------------------------------------------------ writing

void Session::send_json(int status, const nlohmann::json& body) {
  send_response(status, "application/json",
                body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}
void Session::send_json(int status, const Json& body) {
  send_response(status, "application/json", dump_json(body));
}

void Session::send_error(recipe::Api api, int status, const std::string& message, const std::string& param) {
  // Client errors are the client's to see; at debug level the log shows them too (internal errors
  // are logged where they are caught, with their id).
  log::debug("serve", access_method_, " ", access_path_, ": ", status, " ", message);
  recipe::ApiError e(api, status, message, param);
  send_json(status, e.body());
}

// The request's access log line; generations add their tokens and time to first token.
void Session::log_access(int status) {
  if (!st_.cfg.access_log) return;
  if (label_ == "kv_events" && status == 200) return;  // a router polls it ten times a second

  AccessRecord r;
  r.client = access_client_;
  r.method = access_method_;
  r.path = access_path_;
  r.status = status;
  const auto now = std::chrono::steady_clock::now();
  r.duration_s = access_method_.empty() ? 0 : std::chrono::duration<double>(now - access_start_).count();
  if (const Job* job = gen_.job()) {
    r.prompt_tokens = job->usage().prompt_tokens;
    r.completion_tokens = job->usage().completion_tokens;
    if (job->first_token_time())
      r.ttft_s = std::chrono::duration<double>(*job->first_token_time() - job->start_time()).count();
  }
  write_access_line(r);
}

void Session::send_response(int status, std::string_view content_type, std::string_view body) {
  st_.metrics.request_done(label_, status);
  log_access(status);
  std::string s = "HTTP/1.1 " + std::to_string(status) + " " +
                  std::string(http::obsolete_reason(http::int_to_status(unsigned(status)))) +
                  "\r\nServer: beluga\r\nContent-Type: " + std::string(content_type) +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  // Overloaded, loading, restarting, draining: say when to come back (the official SDKs honour it).
  if (status == 503 || status == 429) s += "Retry-After: 1\r\n";
  if (st_.drain.draining()) keep_alive_ = false;
  s += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  s += body;
  head_sent_ = true;
  response_complete_ = true;
  queue_raw(std::move(s));
}

void Session::queue_body(const std::string& data) {
  queue_raw(http11_ ? http_chunk(data) : data);
}

void Session::queue_raw(std::string data) {
  if (closed_) return;
  pending_ += data;
  if (!writing_) do_write();
}

void Session::do_write() {
  inflight_.swap(pending_);
  pending_.clear();
  writing_ = true;
  sync_busy();
  stream_.expires_after(std::chrono::seconds(120));  // a client that stops reading is dropped
  net::async_write(stream_, net::buffer(inflight_),
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
}

void Session::on_write(beast::error_code ec) {
  writing_ = false;
  inflight_.clear();
  stream_.expires_never();
  if (ec) return on_client_gone();
  if (!pending_.empty()) return do_write();
  if (response_complete_ && !gen_.active()) after_response();
  sync_busy();
}

void Session::end_response() {
  response_complete_ = true;
  if (!writing_) after_response();
}

void Session::after_response() {
  response_complete_ = false;
  if (!keep_alive_ || closed_) return do_close();
  if (watching_) {
    resume_after_watch_ = true;
    beast::error_code ec;
    stream_.socket().cancel(ec);
    return;
  }
  do_read();
}

void Session::do_close() {
  if (closed_) return;
  closed_ = true;
  beast::error_code ec;
  if (drain_on_close_) {
    // Half-close, then read and drop what the client still sends (bounded in time and bytes).
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(5));
    return discard_input();
  }
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.socket().close(ec);
}

void Session::discard_input() {
  auto buf = std::make_shared<std::array<char, 65536>>();
  stream_.async_read_some(net::buffer(*buf),
                          [self = shared_from_this(), buf](beast::error_code ec, size_t n) {
                            self->drained_ += n;
                            if (ec || self->drained_ > (size_t(256) << 20)) {
                              beast::error_code ignored;
                              self->stream_.socket().close(ignored);
                              return;
                            }
                            self->discard_input();
                          });
}
}  // namespace beluga::server
