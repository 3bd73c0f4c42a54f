#include "router/prefill_call.h"

#include <chrono>
#include <optional>

#include <boost/beast/core.hpp>
#include <nlohmann/json.hpp>

#include "router/http_headers.h"

namespace beluga::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

constexpr size_t kMaxReport = 1 << 20;

class Call final : public PrefillCall, public std::enable_shared_from_this<Call> {
 public:
  Call(net::any_io_executor exec, Done done) : stream_(exec), done_(std::move(done)) {}

  void run(const std::vector<tcp::endpoint>& eps, const ReplicaAddress& a,
           const http::request<http::string_body>& in, const std::string& kv_target, int connect_timeout_ms,
           int timeout_s) {
    t0_ = std::chrono::steady_clock::now();
    timeout_s_ = timeout_s;
    req_.method(in.method());
    req_.target(in.target());
    req_.version(11);
    for (const auto& f : in) {
      const std::string_view name(f.name_string().data(), f.name_string().size());
      if (hop_by_hop(name) || internal_header(name)) continue;
      req_.set(f.name_string(), f.value());
    }
    req_.set(http::field::host, a.host + ":" + a.port);
    req_.set("x-beluga-prefill-to", kv_target);
    req_.keep_alive(false);
    req_.body() = in.body();
    req_.prepare_payload();
    stream_.expires_after(std::chrono::milliseconds(connect_timeout_ms));
    stream_.async_connect(eps, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->finish(false, "connect: " + ec.message());
      self->write();
    });
  }

  void cancel() override {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->cancelled_ = true;
      beast::error_code ignored;
      self->stream_.socket().close(ignored);
    });
  }

 private:
  void write() {
    stream_.expires_after(std::chrono::seconds(30));
    http::async_write(stream_, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->finish(false, "sending the request: " + ec.message());
      self->res_.emplace();
      self->res_->body_limit(kMaxReport);
      self->stream_.expires_after(std::chrono::seconds(self->timeout_s_));
      http::async_read(self->stream_, self->buf_, *self->res_, [self](beast::error_code ec, size_t) {
        if (ec) return self->finish(false, "reading the report: " + ec.message());
        self->on_report();
      });
    });
  }

  void on_report() {
    out_.reached = true;
    out_.status = res_->get().result_int();
    const std::string& body = res_->get().body();
    bool ok = false;
    std::string err;
    if (!prefill_cached_of_report(body, &out_.cached, &err, &ok))
      return finish(false, "answered " + std::to_string(out_.status) + " " + body.substr(0, 200));
    finish(out_.status == 200 && ok, ok ? "" : err);
  }

  void finish(bool ok, std::string why) {
    if (finished_) return;
    finished_ = true;
    beast::error_code ignored;
    stream_.socket().close(ignored);
    out_.ok = ok && !cancelled_;
    out_.error = cancelled_ ? "cancelled" : std::move(why);
    out_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    Done d = std::move(done_);
    d(std::move(out_));
  }

  beast::tcp_stream stream_;
  Done done_;
  http::request<http::string_body> req_;
  beast::flat_buffer buf_;
  std::optional<http::response_parser<http::string_body>> res_;
  PrefillOutcome out_;
  std::chrono::steady_clock::time_point t0_;
  int timeout_s_ = 600;
  bool finished_ = false, cancelled_ = false;
};

}  // namespace

bool prefill_cached_of_report(const std::string& body, std::string* cached, std::string* error, bool* ok) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (j.value("object", "") != "beluga.prefill") {
    // The API's own error JSON (a 4xx/5xx): say what it says.
    if (j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
        j["error"]["message"].is_string())
      *error = j["error"]["message"].get<std::string>();
    else
      return false;
    *ok = false;
    return true;
  }
  const auto& prompts = j.value("prompts", nlohmann::json::array());
  if (!prompts.is_array() || prompts.empty()) return false;
  cached->clear();
  for (const auto& p : prompts) {
    if (!p.is_object()) return false;
    const auto num = [&](const char* k) -> long long {
      auto it = p.find(k);
      return it != p.end() && it->is_number_integer() ? it->get<long long>() : -1;
    };
    const long long t = num("cached_tokens"), h = num("cached_tokens_host"), d = num("cached_tokens_disk");
    if (t < 0 || h < 0 || d < 0) return false;
    if (!cached->empty()) *cached += ',';
    *cached += std::to_string(t) + "/" + std::to_string(h) + "/" + std::to_string(d);
  }
  *ok = j.value("ok", false);
  if (!*ok) *error = j.value("error", std::string("the transfer failed"));
  return true;
}

std::shared_ptr<PrefillCall> PrefillCall::start(net::any_io_executor exec,
                                                const std::vector<tcp::endpoint>& endpoints,
                                                const ReplicaAddress& engine,
                                                const http::request<http::string_body>& req,
                                                const std::string& kv_target, int connect_timeout_ms,
                                                int timeout_s, Done done) {
  auto c = std::make_shared<Call>(exec, std::move(done));
  c->run(endpoints, engine, req, kv_target, connect_timeout_ms, timeout_s);
  return c;
}

}  // namespace beluga::router
