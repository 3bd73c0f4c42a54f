#include "server/server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/access_log.h"
#include "server/auth.h"
#include "server/build_pool.h"
#include "server/engine_health.h"
#include "server/internal_error.h"
#include "server/job.h"
#include "server/sse.h"
#include "server/utility_routes.h"
#include "server/web_ui.h"
#include "util/error.h"

namespace beluga::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Json = nlohmann::ordered_json;

namespace {
class Session;
}

struct Server::State {
  // What a Session's destructor touches comes first, so that it outlives the io_context (whose
  // destructor destroys the handlers, and the sessions they hold, that never ran).
  ServerConfig cfg;
  Metrics metrics;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::atomic<int> connections{0};  // open sessions (for max_connections)
  // Draining (see Server::drain): the sessions, and how many of them are busy (building, generating
  // or writing a response); guarded by `mu`, with `cv` signalled when busy drops to zero.
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  int busy = 0;
  std::atomic<bool> draining{false};

  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::atomic<bool> ready{false};
  EngineHandle* engine = nullptr;
  ModelInfo info;
  std::unique_ptr<ResponseStore> responses;
  std::unique_ptr<BuildPool> builds;
  std::unique_ptr<EngineHealth> health;
  std::vector<std::thread> threads;
  int64_t started = unix_seconds();

  void busy_delta(int d) {
    std::lock_guard lock(mu);
    busy += d;
    if (busy == 0) cv.notify_all();
  }
  HealthVerdict engine_verdict() {
    if (!ready) return {false, "loading"};
    return health->observe(engine->stats(), std::chrono::steady_clock::now());
  }
};

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

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, Server::State& st)
      : st_(st), stream_(std::move(socket)), exec_(stream_.get_executor()) {
    st_.connections.fetch_add(1);
    st_.metrics.connections(+1);
  }
  ~Session() {
    if (counted_busy_) st_.busy_delta(-1);
    {
      std::lock_guard lock(st_.mu);
      st_.sessions.erase(this);
    }
    st_.connections.fetch_sub(1);
    st_.metrics.connections(-1);
  }

  void run() {
    {
      std::lock_guard lock(st_.mu);
      st_.sessions[this] = weak_from_this();
    }
    net::dispatch(exec_, [self = shared_from_this()] { self->do_read(); });
  }

  // Runs `f` on this connection's strand.
  template <class F>
  void post(F&& f) {
    net::post(exec_, std::forward<F>(f));
  }

  // Server::drain began: a connection waiting for its next request closes now; a busy one closes
  // after its response (responses then say Connection: close).
  void on_drain() {
    if (idle_wait_) do_close();
  }

  // The drain's grace period ended with this request still running: it ends now, a stream with the
  // API's error event, any other request with a 503.
  void on_shutdown() {
    shutting_down_ = true;
    if (active_ || building_)
      end_with_error(error_api(api_), 503, "the server is shutting down; the request was cut short");
  }

 private:
  // ------------------------------------------------------------------ reading requests

  // Between requests of a keep-alive connection: wait (up to the idle timeout) for the next
  // request's first byte; from there (and on a new connection, from its opening) the headers have
  // header_timeout_s to arrive.
  void do_read() {
    if (closed_) return;
    if (served_ > 0 && buffer_.size() == 0) {
      if (st_.draining) return do_close();
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

  void read_header() {
    if (closed_) return;
    head_sent_ = false;
    access_method_.clear();
    access_path_.clear();
    parser_.emplace();
    parser_->body_limit(st_.cfg.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(std::chrono::seconds(st_.cfg.header_timeout_s));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
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

  void read_body() {
    stream_.expires_after(std::chrono::seconds(st_.cfg.body_timeout_s));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read_error(beast::error_code ec) {
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

  void on_read(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    stream_.expires_never();
    http::request<http::string_body> req = parser_->release();
    ++served_;
    keep_alive_ = req.keep_alive() && !st_.draining;
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
  void fail_internal(recipe::Api eapi, std::string_view what) noexcept {
    try {
      end_with_error(eapi, 500, report_internal_error(label_, what));
    } catch (...) {
      do_close();  // out of memory while reporting: at least the client sees the connection end
    }
  }

  // Ends the request in whatever state it is: its engine requests are aborted, a stream whose head
  // went out gets the API's error event and its end, anything else an error response. The
  // connection closes after the reply, since the request may have been left half-way.
  void end_with_error(recipe::Api eapi, int status, const std::string& msg) {
    keep_alive_ = false;
    if (job_ || active_)
      for (const auto& id : ids_) st_.engine->abort(id);
    ids_.clear();
    ++gen_;  // outputs still on their way, and a build in progress, are stale
    if (building_) set_building_done();
    if (active_) {
      active_ = false;
      st_.metrics.in_flight(-1);
    }
    if (head_sent_ && stream_mode_) {
      std::string out;
      if (job_ && !job_->complete()) job_->fail(msg, out);
      job_.reset();
      if (!out.empty()) queue_body(out);
      if (http11_) queue_raw(http_chunk(""));
      st_.metrics.request_done(label_, status);
      response_complete_ = true;
      if (!writing_) after_response();
    } else if (head_sent_) {  // a reply is already on its way: end the connection after it
      job_.reset();
      response_complete_ = true;
      if (!writing_) after_response();
    } else {
      job_.reset();
      send_error(eapi, status, msg, "");
    }
    sync_busy();
  }

  void set_building_done() {
    building_ = false;
    st_.metrics.building(-1);
  }

  // Counts this session in State::busy while it builds, generates or writes.
  void sync_busy() {
    const bool b = building_ || active_ || writing_;
    if (b == counted_busy_) return;
    counted_busy_ = b;
    st_.busy_delta(b ? +1 : -1);
  }

  // ------------------------------------------------------------------ routing

  std::string presented_key(const http::request<http::string_body>& req) const {
    auto it = req.find(http::field::authorization);
    if (it != req.end()) {
      std::string_view v = sv(it->value());
      if (v.size() > 7 && beast::iequals(it->value().substr(0, 7), "Bearer "))
        return std::string(v.substr(7));
    }
    it = req.find("x-api-key");
    if (it != req.end()) return std::string(it->value());
    return {};
  }

  void route(http::request<http::string_body>& req) {
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
      return send_response(200, "application/json", R"({"status":"ok"})");
    }
    if (path == "/ready") {
      // Readiness: take new requests here (not while loading, draining or unhealthy).
      label_ = "health";
      if (!st_.ready) return send_response(503, "application/json", R"({"status":"loading"})");
      if (st_.draining) return send_response(503, "application/json", R"({"status":"draining"})");
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
      auto r =
          handle_utility_route(path, sv(req.method_string()), req.body(), st_.ready ? &st_.info : nullptr);
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
    if (st_.draining) return send_error(eapi, 503, "the server is shutting down", "");
    handle_generate(*api, req);
  }

  // GET / DELETE /v1/responses/{id}: only the tenant that created a response sees it.
  void handle_stored_response(const http::request<http::string_body>& req, const std::string& id) {
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
  void handle_generate(ServerApi api, http::request<http::string_body>& req) {
    const recipe::Api eapi = error_api(api);
    api_ = api;
    stream_mode_ = false;
    salt_ = presented_key(req);
    header_class_ = std::string(req["x-traffic-class"]);
    building_ = true;
    client_gone_ = false;
    const uint64_t gen = ++gen_;
    auto task = [self = shared_from_this(), api, gen, salt = salt_, body = std::move(req.body())] {
      Built r;
      try {
        r.request = build_request(api, body, self->st_.info, StoreView{self->st_.responses.get(), salt});
      } catch (const recipe::ApiError& e) {
        r.client_error = e;
      } catch (const std::exception& e) {
        r.internal_error = e.what();
      } catch (...) {
        r.internal_error = "unknown exception";
      }
      net::post(self->exec_, [self, gen, r = std::move(r)]() mutable { self->on_built(gen, std::move(r)); });
    };
    if (!st_.builds->try_submit(std::move(task))) {
      building_ = false;
      st_.metrics.build_rejected();
      return send_error(eapi, 503, "the server is overloaded (too many requests being prepared); retry later",
                        "");
    }
    st_.metrics.building(+1);
    sync_busy();
    arm_watch();  // notice a client that leaves while its request is built
  }

  void on_built(uint64_t gen, Built r) {
    if (gen != gen_ || !building_) return;  // ended meanwhile (shutdown)
    set_building_done();
    const recipe::Api eapi = error_api(api_);
    try {
      if (client_gone_) {
        st_.metrics.disconnect();
        st_.metrics.request_done(label_, 499);
        do_close();
      } else if (shutting_down_) {
        send_error(eapi, 503, "the server is shutting down", "");
      } else if (!r.internal_error.empty()) {
        fail_internal(eapi, r.internal_error);
      } else if (r.client_error) {
        send_json(r.client_error->status(), r.client_error->body());
      } else {
        start_job(std::move(*r.request));
      }
    } catch (const std::exception& e) {
      fail_internal(eapi, e.what());
    }
    sync_busy();
  }

  // Submits the built request's prompts to the engine and starts the response.
  void start_job(BuiltRequest b) {
    const ServerApi api = api_;
    const recipe::Api eapi = error_api(api);
    const std::string& salt = salt_;
    // KV retention class: the body's traffic_class, else the x-traffic-class header, else chat.
    std::string traffic_class = !b.traffic_class.empty() ? b.traffic_class : header_class_;
    if (traffic_class.empty()) traffic_class = "chat";
    const auto& classes = st_.info.traffic_classes;
    if (std::find(classes.begin(), classes.end(), traffic_class) == classes.end())
      return send_error(eapi, 400, "unknown traffic_class '" + traffic_class + "'", "traffic_class");
    stream_mode_ = b.stream;
    job_ =
        std::make_unique<Job>(std::move(b.spec), *st_.info.tokenizer, make_formatter(api, b.ctx), b.stream);
    ++gen_;
    ids_.clear();
    to_store_.reset();
    for (size_t k = 0; k < b.prompts.size(); ++k) {
      EngineRequest er;
      er.id = b.prompts.size() == 1 ? b.ctx.id : b.ctx.id + "-" + std::to_string(k);
      er.prompt = std::move(b.prompts[k]);
      er.sampling = b.sampling;
      er.cache_salt = salt;
      er.traffic_class = traffic_class;
      er.logits_processor = b.logits_processor;
      er.on_output = [self = shared_from_this(), exec = exec_, gen = gen_, sub = int(k)](RequestOutput&& o) {
        net::post(exec, [self, gen, sub, o = std::move(o)]() mutable {
          self->on_engine_output(gen, sub, std::move(o));
        });
      };
      std::string why;
      SubmitStatus s = st_.engine->submit(std::move(er), &why);
      if (s != SubmitStatus::kOk) {
        for (const auto& id : ids_) st_.engine->abort(id);
        ids_.clear();
        job_.reset();
        ++gen_;  // outputs of the aborted sub-requests are stale
        switch (s) {
          case SubmitStatus::kQueueFull:
            return send_error(eapi, 429, "the server is at capacity (request queue full); retry later", "");
          case SubmitStatus::kPromptTooLong:
            return send_error(eapi, 400, why.empty() ? "the prompt is longer than the model's context" : why,
                              "messages");
          default:
            return send_error(eapi, 400, why.empty() ? "the engine rejected the request" : why, "");
        }
      }
      ids_.push_back(b.prompts.size() == 1 ? b.ctx.id : b.ctx.id + "-" + std::to_string(k));
    }
    if (b.store) {
      to_store_ = std::make_shared<StoredResponse>();
      to_store_->tenant = salt;
      to_store_->input = std::move(b.input);
      to_store_->previous = std::move(b.previous);
    }
    active_ = true;
    st_.metrics.in_flight(+1);
    if (stream_mode_) {
      std::string head =
          "HTTP/1.1 200 OK\r\nServer: beluga\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
          "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
      if (http11_)
        head += "Transfer-Encoding: chunked\r\n";
      else
        keep_alive_ = false;
      if (st_.draining) keep_alive_ = false;
      head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      head_sent_ = true;
      queue_raw(std::move(head));
    }
    arm_watch();
  }

  void on_engine_output(uint64_t gen, int sub, RequestOutput&& o) {
    if (gen != gen_ || !active_ || !job_) return;
    try {
      std::string out;
      job_->on_output(sub, std::move(o), out);
      if (job_->complete()) return finish_job(std::move(out));
      if (stream_mode_ && !out.empty()) queue_body(out);
    } catch (const std::exception& e) {
      fail_internal(error_api(api_), e.what());
    }
  }

  // `out`: the stream's last events.
  void finish_job(std::string out) {
    active_ = false;
    st_.metrics.in_flight(-1);
    bool aborted_early = false;
    for (int k = 0; k < job_->num_subs() && size_t(k) < ids_.size(); ++k) {
      if (job_->engine_active(k)) {
        st_.engine->abort(ids_[size_t(k)]);
        aborted_early = true;
      }
    }
    if (aborted_early) st_.metrics.stop_abort();
    ++gen_;  // later outputs (the aborted requests' last words) are stale
    const auto now = std::chrono::steady_clock::now();
    const Usage& u = job_->usage();
    const double e2e = std::chrono::duration<double>(now - job_->start_time()).count();
    double ttft = 0, tpot = 0;
    const bool has_ttft = job_->first_token_time().has_value();
    if (has_ttft)
      ttft = std::chrono::duration<double>(*job_->first_token_time() - job_->start_time()).count();
    const int64_t per_choice =
        job_->choices().empty() ? 0 : u.completion_tokens / int64_t(job_->choices().size());
    const bool has_tpot = has_ttft && per_choice > 1;
    if (has_tpot) tpot = (e2e - ttft) / double(per_choice - 1);
    st_.metrics.tokens(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
    st_.metrics.latency(ttft, tpot, e2e, has_ttft, has_tpot);

    Json response;
    if (!job_->failed()) {
      response = job_->final_response();
      // Stored before the client can see the response end, so a follow-up may name it at once.
      if (to_store_ && response.is_object()) {
        to_store_->response = response;
        st_.responses->put(std::move(to_store_));
      }
    }
    to_store_.reset();

    if (stream_mode_) {
      if (!out.empty()) queue_body(out);
      st_.metrics.request_done(label_, 200);
      log_access(200);
      if (http11_) queue_raw(http_chunk(""));
      response_complete_ = true;
      if (!writing_) after_response();
    } else if (job_->failed()) {
      send_error(error_api(api_), 500, job_->error(), "");
    } else {
      send_json(200, response);
    }
    job_.reset();
    sync_busy();
  }

  // The client went away (write failed or the connection closed while generating).
  void on_client_gone() {
    if (active_) {
      active_ = false;
      st_.metrics.in_flight(-1);
      st_.metrics.disconnect();
      st_.metrics.request_done(label_, 499);
      log_access(499);
      for (int k = 0; job_ && k < job_->num_subs() && size_t(k) < ids_.size(); ++k)
        if (job_->engine_active(k)) st_.engine->abort(ids_[size_t(k)]);
      ++gen_;
      job_.reset();
      to_store_.reset();
    }
    do_close();
    sync_busy();
  }

  // While generating, a read on the socket tells us when the client closes the connection.
  void arm_watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    auto mb = buffer_.prepare(4096);
    stream_.socket().async_read_some(
        mb, [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (!ec) buffer_.commit(n);
    if (resume_after_watch_) {
      resume_after_watch_ = false;
      if (ec && ec != net::error::operation_aborted) return do_close();
      return do_read();
    }
    if (building_) {
      if (ec)
        client_gone_ = true;  // on_built closes
      else if (buffer_.size() > st_.cfg.max_body_bytes + 65536)
        client_gone_ = true;
      else
        arm_watch();
      return;
    }
    if (active_) {
      if (ec) return on_client_gone();
      if (buffer_.size() > st_.cfg.max_body_bytes + 65536) return on_client_gone();  // pipelining abuse
      return arm_watch();
    }
    if (ec && ec != net::error::operation_aborted) keep_alive_ = false;
  }

  // ------------------------------------------------------------------ writing

  void send_json(int status, const nlohmann::json& body) {
    send_response(status, "application/json",
                  body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  void send_json(int status, const Json& body) { send_response(status, "application/json", dump_json(body)); }

  void send_error(recipe::Api api, int status, const std::string& message, const std::string& param) {
    recipe::ApiError e(api, status, message, param);
    send_json(status, e.body());
  }

  // The request's access log line; generations add their tokens and time to first token.
  void log_access(int status) {
    if (!st_.cfg.access_log) return;
    AccessRecord r;
    r.client = access_client_;
    r.method = access_method_;
    r.path = access_path_;
    r.status = status;
    const auto now = std::chrono::steady_clock::now();
    r.duration_s = access_method_.empty() ? 0 : std::chrono::duration<double>(now - access_start_).count();
    if (job_) {
      r.prompt_tokens = job_->usage().prompt_tokens;
      r.completion_tokens = job_->usage().completion_tokens;
      if (job_->first_token_time())
        r.ttft_s = std::chrono::duration<double>(*job_->first_token_time() - job_->start_time()).count();
    }
    write_access_line(r);
  }

  void send_response(int status, std::string_view content_type, std::string_view body) {
    st_.metrics.request_done(label_, status);
    log_access(status);
    std::string s = "HTTP/1.1 " + std::to_string(status) + " " +
                    std::string(http::obsolete_reason(http::int_to_status(unsigned(status)))) +
                    "\r\nServer: beluga\r\nContent-Type: " + std::string(content_type) +
                    "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    if (st_.draining) keep_alive_ = false;
    s += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    s += body;
    head_sent_ = true;
    response_complete_ = true;
    queue_raw(std::move(s));
  }

  void queue_body(const std::string& data) { queue_raw(http11_ ? http_chunk(data) : data); }

  void queue_raw(std::string data) {
    if (closed_) return;
    pending_ += data;
    if (!writing_) do_write();
  }

  void do_write() {
    inflight_.swap(pending_);
    pending_.clear();
    writing_ = true;
    sync_busy();
    stream_.expires_after(std::chrono::seconds(120));  // a client that stops reading is dropped
    net::async_write(stream_, net::buffer(inflight_),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    inflight_.clear();
    stream_.expires_never();
    if (ec) return on_client_gone();
    if (!pending_.empty()) return do_write();
    if (response_complete_ && !active_) after_response();
    sync_busy();
  }

  void after_response() {
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

  void do_close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    if (drain_on_close_) {
      // Half-close, then read and drop what the client still sends (bounded in time and bytes).
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      stream_.expires_after(std::chrono::seconds(5));
      return drain();
    }
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  void drain() {
    auto buf = std::make_shared<std::array<char, 65536>>();
    stream_.async_read_some(net::buffer(*buf),
                            [self = shared_from_this(), buf](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > (size_t(256) << 20)) {
                                beast::error_code ignored;
                                self->stream_.socket().close(ignored);
                                return;
                              }
                              self->drain();
                            });
  }

  Server::State& st_;
  beast::tcp_stream stream_;
  const net::any_io_executor exec_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool keep_alive_ = true, http11_ = true, closed_ = false, drain_on_close_ = false;
  bool head_sent_ = false;  // this request's response (or stream) head is queued
  size_t drained_ = 0;
  uint64_t served_ = 0;     // requests read on this connection
  bool idle_wait_ = false;  // waiting for the next request's first byte
  bool counted_busy_ = false, shutting_down_ = false;
  std::string label_ = "other";
  std::string access_client_, access_method_, access_path_;  // for the access log
  std::chrono::steady_clock::time_point access_start_;

  // The generation in flight.
  ServerApi api_ = ServerApi::kChat;
  std::unique_ptr<Job> job_;
  std::shared_ptr<StoredResponse> to_store_;  // Responses with store: kept once the job completes
  std::vector<std::string> ids_;
  std::string header_class_;  // the request's x-traffic-class header
  uint64_t gen_ = 0;
  bool active_ = false, stream_mode_ = false;
  bool building_ = false, client_gone_ = false;  // on the build pool; the client left meanwhile
  std::string salt_;                             // the request's API key (prefix-cache salt, store tenant)

  // Writes.
  std::string pending_, inflight_;
  bool writing_ = false, response_complete_ = false;
  bool watching_ = false, resume_after_watch_ = false;
};

// Handlers hold a plain pointer: the State owns the io_context that stores them, so a shared_ptr here
// would keep the State alive forever (a leak). Server::stop() joins the I/O threads before the State
// goes away, and no handler runs after that.
// A connection past max_connections: a 503 in the OpenAI error shape (the path is not read, so the
// API is not known), then a half-close and a short read of whatever the client sent, so the client
// reads the 503 rather than a reset. Bounded: 5 s and 64 KiB at most.
struct Rejected {
  explicit Rejected(tcp::socket s) : stream(std::move(s)) {}
  beast::tcp_stream stream;
  std::string reply;
  std::array<char, 4096> sink{};
  size_t drained = 0;
};

void drain_rejected(const std::shared_ptr<Rejected>& r) {
  r->stream.async_read_some(net::buffer(r->sink), [r](beast::error_code ec, size_t n) {
    r->drained += n;
    if (!ec && r->drained <= 65536) drain_rejected(r);
  });
}

void reject_connection(tcp::socket socket, Server::State& st) {
  recipe::ApiError e(recipe::Api::kChat, 503,
                     "the server is at its connection limit (" + std::to_string(st.cfg.max_connections) +
                         " open connections); retry later");
  const std::string body = e.body().dump();
  auto r = std::make_shared<Rejected>(std::move(socket));
  r->reply =
      "HTTP/1.1 503 Service Unavailable\r\nServer: beluga\r\nContent-Type: application/json\r\n"
      "Retry-After: 1\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  r->stream.expires_after(std::chrono::seconds(5));
  st.metrics.connection_rejected();
  net::async_write(r->stream, net::buffer(r->reply), [r](beast::error_code ec, size_t) {
    if (ec) return;
    r->stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    drain_rejected(r);
  });
}

void do_accept(Server::State* st) {
  st->acceptor.async_accept(net::make_strand(st->ioc), [st](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !st->acceptor.is_open()) return;
    if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (st->connections.load() >= st->cfg.max_connections)
        reject_connection(std::move(socket), *st);
      else
        std::make_shared<Session>(std::move(socket), *st)->run();
    } else {
      // Out of descriptors (EMFILE) or the like: pause instead of spinning on the error.
      std::fprintf(stderr, "beluga serve: accept failed: %s\n", ec.message().c_str());
      auto t = std::make_shared<net::steady_timer>(st->ioc, std::chrono::milliseconds(100));
      t->async_wait([st, t](beast::error_code) { do_accept(st); });
      return;
    }
    do_accept(st);
  });
}

// Runs `fn` on every open session's strand.
void for_each_session(Server::State& st, void (Session::*fn)()) {
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(st.mu);
    for (auto& [p, w] : st.sessions)
      if (auto s = w.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->post([s, fn] { (s.get()->*fn)(); });
}

}  // namespace

Server::Server(ServerConfig cfg) : st_(std::make_shared<State>()) {
  st_->cfg = std::move(cfg);
  st_->responses = std::make_unique<ResponseStore>(st_->cfg.max_stored_responses);
  st_->builds = std::make_unique<BuildPool>(st_->cfg.build_threads, st_->cfg.build_queue);
  st_->health = std::make_unique<EngineHealth>(std::chrono::seconds(st_->cfg.engine_stall_s));
}

Server::~Server() {
  stop();
}

void Server::listen() {
  beast::error_code ec;
  auto addr = net::ip::make_address(st_->cfg.host, ec);
  if (ec) {
    // A host name: resolve it.
    tcp::resolver resolver(st_->ioc);
    auto results = resolver.resolve(st_->cfg.host, std::to_string(st_->cfg.port), ec);
    BELUGA_CHECK(!ec && !results.empty(), "cannot resolve --host ", st_->cfg.host, ": ", ec.message());
    addr = results.begin()->endpoint().address();
  }
  tcp::endpoint ep(addr, static_cast<unsigned short>(st_->cfg.port));
  st_->acceptor.open(ep.protocol(), ec);
  BELUGA_CHECK(!ec, "cannot open a socket: ", ec.message());
  st_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  st_->acceptor.bind(ep, ec);
  BELUGA_CHECK(!ec, "cannot listen on ", st_->cfg.host, ":", st_->cfg.port, ": ", ec.message());
  st_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  BELUGA_CHECK(!ec, "cannot listen on ", st_->cfg.host, ":", st_->cfg.port, ": ", ec.message());
  do_accept(st_.get());
}

int Server::port() const {
  beast::error_code ec;
  auto ep = st_->acceptor.local_endpoint(ec);
  return ec ? -1 : ep.port();
}

void Server::set_engine(EngineHandle* engine, ModelInfo info) {
  // Handlers read these only after seeing ready == true (release/acquire through the atomic).
  st_->engine = engine;
  st_->info = std::move(info);
  st_->ready.store(true);
  st_->engine_verdict();  // the first sample: the baseline of "recent steps"
}

void Server::start() {
  const int n = std::max(1, st_->cfg.io_threads);
  for (int i = 0; i < n; ++i)
    st_->threads.emplace_back([st = st_] {
      for (;;) {
        try {
          st->ioc.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "beluga serve: I/O thread error: %s\n", e.what());
        }
      }
    });
}

void Server::block_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

void Server::wait_for_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  // Wait in a helper thread for the signals (blocked in every thread), or for stop().
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread waiter([this, set] {
    int sig = 0;
    sigwait(&set, &sig);
    std::lock_guard lock(st_->mu);
    st_->stopping = true;
    st_->cv.notify_all();
  });
  {
    std::unique_lock lock(st_->mu);
    st_->cv.wait(lock, [&] { return st_->stopping; });
  }
  // Wake the waiter if stop() (not a signal) ended the wait.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
}

bool Server::drain(std::chrono::seconds grace) {
  State& st = *st_;
  st.draining = true;
  net::post(st.ioc, [&st] {
    beast::error_code ec;
    st.acceptor.close(ec);
  });
  for_each_session(st, &Session::on_drain);
  std::unique_lock lock(st.mu);
  if (st.cv.wait_for(lock, grace, [&] { return st.busy == 0; })) return true;
  lock.unlock();
  for_each_session(st, &Session::on_shutdown);
  lock.lock();
  // The cut requests' last words (error events, 503s) get a few seconds to reach their clients.
  st.cv.wait_for(lock, std::chrono::seconds(5), [&] { return st.busy == 0; });
  return false;
}

void Server::stop() {
  st_->builds->stop();  // its tasks post to the I/O threads: it stops first
  {
    std::lock_guard lock(st_->mu);
    st_->stopping = true;
    st_->cv.notify_all();
  }
  net::post(st_->ioc, [st = st_.get()] {
    beast::error_code ec;
    st->acceptor.close(ec);
  });
  st_->ioc.stop();
  for (auto& t : st_->threads)
    if (t.joinable()) t.join();
  st_->threads.clear();
}

Metrics& Server::metrics() {
  return st_->metrics;
}

}  // namespace beluga::server
