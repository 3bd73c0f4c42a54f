#include "server/server.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/access_log.h"
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

struct Server::State {
  ServerConfig cfg;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::atomic<bool> ready{false};
  EngineHandle* engine = nullptr;
  ModelInfo info;
  Metrics metrics;
  std::unique_ptr<ResponseStore> responses;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  int64_t started = unix_seconds();
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
      : st_(st), stream_(std::move(socket)), exec_(stream_.get_executor()) {}

  void run() {
    net::dispatch(exec_, [self = shared_from_this()] { self->do_read(); });
  }

 private:
  // ------------------------------------------------------------------ reading requests

  void do_read() {
    if (closed_) return;
    access_method_.clear();
    access_path_.clear();
    parser_.emplace();
    parser_->body_limit(st_.cfg.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(std::chrono::seconds(st_.cfg.idle_timeout_s));
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
    stream_.expires_after(std::chrono::seconds(st_.cfg.idle_timeout_s));
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
    keep_alive_ = req.keep_alive();
    http11_ = req.version() >= 11;
    try {
      route(req);
    } catch (const std::exception& e) {
      // Never let a request take the process down.
      send_error(api_of_path(strip_query(req.target())), 500, std::string("internal error: ") + e.what(), "");
    }
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

  void route(const http::request<http::string_body>& req) {
    const std::string path(strip_query(req.target()));
    const auto method = req.method();
    const recipe::Api eapi = api_of_path(path);
    label_ = "other";

    if (path == "/health" || path == "/ping") {
      label_ = "health";
      if (!st_.ready) return send_response(503, "application/json", R"({"status":"loading"})");
      return send_response(200, "application/json", R"({"status":"ok"})");
    }
    if (path == "/metrics") {
      label_ = "metrics";
      std::optional<EngineStats> stats;
      if (st_.ready) stats = st_.engine->stats();
      return send_response(200, "text/plain; version=0.0.4; charset=utf-8",
                           st_.metrics.render(stats ? &*stats : nullptr, st_.info.served_name));
    }
    if (auto page = web_asset(path)) {  // the web chat page (web_ui.h); public: it asks for the key itself
      label_ = "web";
      if (method != http::verb::get) return send_error(eapi, 405, "use GET for " + path, "");
      return send_response(200, page->content_type, page->body);
    }
    if (!path.starts_with("/v1/") && !is_utility_route(path))
      return send_error(eapi, 404, "no route for " + path, "");

    if (!st_.cfg.api_key.empty() && presented_key(req) != st_.cfg.api_key)
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

  void handle_generate(ServerApi api, const http::request<http::string_body>& req) {
    const recipe::Api eapi = error_api(api);
    const std::string salt = presented_key(req);
    BuiltRequest b;
    try {
      b = build_request(api, req.body(), st_.info, StoreView{st_.responses.get(), salt});
    } catch (const recipe::ApiError& e) {
      return send_json(e.status(), e.body());
    } catch (const std::exception& e) {
      return send_error(eapi, 400, e.what(), "");
    }
    api_ = api;
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
      head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      queue_raw(std::move(head));
    }
    arm_watch();
  }

  void on_engine_output(uint64_t gen, int sub, RequestOutput&& o) {
    if (gen != gen_ || !active_ || !job_) return;
    std::string out;
    job_->on_output(sub, std::move(o), out);
    if (job_->complete()) return finish_job(std::move(out));
    if (stream_mode_ && !out.empty()) queue_body(out);
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
    s += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    s += body;
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
  size_t drained_ = 0;
  std::string label_ = "other";
  std::string access_client_, access_method_, access_path_;  // for the access log
  std::chrono::steady_clock::time_point access_start_;

  // The generation in flight.
  ServerApi api_ = ServerApi::kChat;
  std::unique_ptr<Job> job_;
  std::shared_ptr<StoredResponse> to_store_;  // Responses with store: kept once the job completes
  std::vector<std::string> ids_;
  uint64_t gen_ = 0;
  bool active_ = false, stream_mode_ = false;

  // Writes.
  std::string pending_, inflight_;
  bool writing_ = false, response_complete_ = false;
  bool watching_ = false, resume_after_watch_ = false;
};

// Handlers hold a plain pointer: the State owns the io_context that stores them, so a shared_ptr here
// would keep the State alive forever (a leak). Server::stop() joins the I/O threads before the State
// goes away, and no handler runs after that.
void do_accept(Server::State* st) {
  st->acceptor.async_accept(net::make_strand(st->ioc), [st](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !st->acceptor.is_open()) return;
    if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(std::move(socket), *st)->run();
    }
    do_accept(st);
  });
}

}  // namespace

Server::Server(ServerConfig cfg) : st_(std::make_shared<State>()) {
  st_->cfg = std::move(cfg);
  st_->responses = std::make_unique<ResponseStore>(st_->cfg.max_stored_responses);
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

void Server::stop() {
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
