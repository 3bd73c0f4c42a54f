#include "server/generation.h"

#include <algorithm>
#include <chrono>

#include "server/session.h"
#include "server/sse.h"

namespace beluga::server {

namespace net = boost::asio;
using Json = nlohmann::ordered_json;

// Parsing, templating and tokenizing run on the build pool; the result comes back to the strand.
void Generation::start(ServerApi api, std::string salt, std::string header_class, PdRequest pd,
                       std::string body) {
  Server::State& st = s_.st_;
  const recipe::Api eapi = error_api(api);
  api_ = api;
  stream_mode_ = false;
  salt_ = std::move(salt);
  header_class_ = std::move(header_class);
  pd_ = std::move(pd);
  building_ = true;
  client_gone_ = false;
  const uint64_t gen = ++gen_;
  auto task = [self = s_.shared_from_this(), this, api, gen, salt = salt_, body = std::move(body)] {
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
    // `this` lives in the session `self` keeps alive.
    self->post([self, this, gen, r = std::move(r)]() mutable { on_built(gen, std::move(r)); });
  };
  if (!st.builds->try_submit(std::move(task))) {
    building_ = false;
    st.metrics.build_rejected();
    return s_.send_error(eapi, 503,
                         "the server is overloaded (too many requests being prepared); retry later", "");
  }
  st.metrics.building(+1);
  s_.sync_busy();
  s_.arm_watch();  // notice a client that leaves while its request is built
}

void Generation::set_building_done() {
  building_ = false;
  s_.st_.metrics.building(-1);
}

void Generation::on_built(uint64_t gen, Built r) {
  if (gen != gen_ || !building_) return;  // ended meanwhile (shutdown)
  Server::State& st = s_.st_;
  set_building_done();
  const recipe::Api eapi = error_api(api_);
  try {
    if (client_gone_) {
      st.metrics.disconnect();
      st.metrics.request_done(s_.label_, 499);
      s_.do_close();
    } else if (s_.shutting_down_) {
      s_.send_error(eapi, 503, "the server is shutting down", "");
    } else if (!r.internal_error.empty()) {
      s_.fail_internal(eapi, r.internal_error);
    } else if (r.client_error) {
      s_.send_json(r.client_error->status(), r.client_error->body());
    } else {
      start_job(std::move(*r.request));
    }
  } catch (const std::exception& e) {
    s_.fail_internal(eapi, e.what());
  }
  s_.sync_busy();
}

void Generation::start_job(BuiltRequest b) {
  Server::State& st = s_.st_;
  const ServerApi api = api_;
  const recipe::Api eapi = error_api(api);
  const std::string& salt = salt_;
  // KV retention class: the body's traffic_class, else the x-traffic-class header, else chat.
  std::string traffic_class = !b.traffic_class.empty() ? b.traffic_class : header_class_;
  if (traffic_class.empty()) traffic_class = "chat";
  const auto& classes = st.info.traffic_classes;
  if (std::find(classes.begin(), classes.end(), traffic_class) == classes.end())
    return s_.send_error(eapi, 400, "unknown traffic_class '" + traffic_class + "'", "traffic_class");
  const bool prefill = !pd_.prefill_to.empty();
  if (prefill) {
    // The prompt's KV is what the decode engine needs: one token computes it. The decode engine
    // applies the request's own limits, stream, grammar and store.
    b.sampling.max_tokens = 1;
    b.sampling.min_tokens = 0;
    b.stream = false;
    b.store = false;
    b.logits_processor = {};
    prefill_prompts_ = b.prompts;
  }
  traffic_class_ = traffic_class;
  stream_mode_ = b.stream;
  job_ = std::make_unique<Job>(std::move(b.spec), *st.info.tokenizer, make_formatter(api, b.ctx), b.stream);
  if (!pd_.cached.empty() && pd_.cached.size() == b.prompts.size()) {
    std::vector<Job::CachedCounts> c;
    for (const auto& x : pd_.cached) c.push_back({x.tokens, x.host, x.disk});
    job_->set_prefill_cached(std::move(c));
  }
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
    // Delivered on the engine thread: posted to the strand. `this` lives in the session `self` keeps alive.
    er.on_output = [self = s_.shared_from_this(), this, gen = gen_, sub = int(k)](RequestOutput&& o) {
      self->post(
          [self, this, gen, sub, o = std::move(o)]() mutable { on_engine_output(gen, sub, std::move(o)); });
    };
    std::string why;
    SubmitStatus s = st.engine->submit(std::move(er), &why);
    if (s != SubmitStatus::kOk) {
      for (const auto& id : ids_) st.engine->abort(id);
      ids_.clear();
      job_.reset();
      ++gen_;  // outputs of the aborted sub-requests are stale
      switch (s) {
        case SubmitStatus::kQueueFull:
          return s_.send_error(eapi, 429, "the server is at capacity (request queue full); retry later", "");
        case SubmitStatus::kUnavailable:
          return s_.send_error(eapi, 503,
                               why.empty() ? "the model is not available right now; retry later" : why, "");
        case SubmitStatus::kPromptTooLong:
          return s_.send_error(eapi, 400, why.empty() ? "the prompt is longer than the model's context" : why,
                               "messages");
        default:
          return s_.send_error(eapi, 400, why.empty() ? "the engine rejected the request" : why, "");
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
  st.metrics.in_flight(+1);
  if (stream_mode_) {
    std::string head =
        "HTTP/1.1 200 OK\r\nServer: beluga\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
        "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
    if (s_.http11_)
      head += "Transfer-Encoding: chunked\r\n";
    else
      s_.keep_alive_ = false;
    if (st.drain.draining()) s_.keep_alive_ = false;
    head += s_.keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    s_.head_sent_ = true;
    s_.queue_raw(std::move(head));
  }
  s_.arm_watch();
}

void Generation::on_engine_output(uint64_t gen, int sub, RequestOutput&& o) {
  if (gen != gen_ || !active_ || !job_) return;
  try {
    std::string out;
    job_->on_output(sub, std::move(o), out);
    if (job_->complete())
      return !pd_.prefill_to.empty() && !job_->failed() ? finish_prefill() : finish_job(std::move(out));
    if (stream_mode_ && !out.empty()) s_.queue_body(out);
  } catch (const std::exception& e) {
    s_.fail_internal(error_api(api_), e.what());
  }
}

void Generation::finish_job(std::string out) {
  Server::State& st = s_.st_;
  active_ = false;
  st.metrics.in_flight(-1);
  bool aborted_early = false;
  for (int k = 0; k < job_->num_subs() && size_t(k) < ids_.size(); ++k) {
    if (job_->engine_active(k)) {
      st.engine->abort(ids_[size_t(k)]);
      aborted_early = true;
    }
  }
  if (aborted_early) st.metrics.stop_abort();
  ++gen_;  // later outputs (the aborted requests' last words) are stale
  const auto now = std::chrono::steady_clock::now();
  const Usage& u = job_->usage();
  const double e2e = std::chrono::duration<double>(now - job_->start_time()).count();
  double ttft = 0, tpot = 0;
  const bool has_ttft = job_->first_token_time().has_value();
  if (has_ttft) ttft = std::chrono::duration<double>(*job_->first_token_time() - job_->start_time()).count();
  const int64_t per_choice =
      job_->choices().empty() ? 0 : u.completion_tokens / int64_t(job_->choices().size());
  const bool has_tpot = has_ttft && per_choice > 1;
  if (has_tpot) tpot = (e2e - ttft) / double(per_choice - 1);
  st.metrics.tokens(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
  st.metrics.latency(ttft, tpot, e2e, has_ttft, has_tpot);

  Json response;
  if (!job_->failed()) {
    response = job_->final_response();
    // Stored before the client can see the response end, so a follow-up may name it at once.
    if (to_store_ && response.is_object()) {
      to_store_->response = response;
      st.responses->put(std::move(to_store_));
    }
  }
  to_store_.reset();

  if (stream_mode_) {
    if (!out.empty()) s_.queue_body(out);
    st.metrics.request_done(s_.label_, 200);
    s_.log_access(200);
    if (s_.http11_) s_.queue_raw(http_chunk(""));
    s_.end_response();
  } else if (job_->failed()) {
    s_.send_error(error_api(api_), job_->unavailable() ? 503 : 500, job_->error(), "");
  } else {
    s_.send_json(200, response);
  }
  job_.reset();
  s_.sync_busy();
}

void Generation::finish_prefill() {
  Server::State& st = s_.st_;
  PrefillReport report;
  report.prompts.resize(prefill_prompts_.size());
  for (size_t k = 0; k < prefill_prompts_.size(); ++k) {
    report.prompts[k].tokens = int(prefill_prompts_[k].size());
    const Job::CachedCounts c = job_->sub_cached(int(k));
    report.prompts[k].cached = {c.tokens, c.host, c.disk};
  }
  // Still active (the session is busy, a client that leaves is noticed) until the blocks are sent.
  auto task = [self = s_.shared_from_this(), this, gen = gen_, pd = &st.info.pd, dest = pd_.prefill_to,
               salt = salt_, cls = traffic_class_, prompts = std::move(prefill_prompts_),
               report = std::move(report)]() mutable {
    try {
      send_prompt_blocks(*pd, dest, salt, cls, prompts, &report);
    } catch (const std::exception& e) {
      report.ok = false;
      report.error = e.what();
    }
    self->post(
        [self, this, gen, report = std::move(report)]() mutable { on_prefill_sent(gen, std::move(report)); });
  };
  prefill_prompts_.clear();
  net::post(*st.transfers, std::move(task));
}

void Generation::on_prefill_sent(uint64_t gen, PrefillReport report) {
  if (gen != gen_ || !active_ || !job_) return;  // the client left (or the server cut it short) meanwhile
  Server::State& st = s_.st_;
  active_ = false;
  st.metrics.in_flight(-1);
  ++gen_;
  const Usage& u = job_->usage();
  st.metrics.tokens(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
  s_.send_json(report.ok ? 200 : 502, prefill_report_json(report));
  job_.reset();
  s_.sync_busy();
}

std::string Generation::cut_short(const std::string& msg, bool stream_open) {
  Server::State& st = s_.st_;
  if (job_ || active_)
    for (const auto& id : ids_) st.engine->abort(id);
  ids_.clear();
  ++gen_;  // outputs still on their way, and a build in progress, are stale
  if (building_) set_building_done();
  if (active_) {
    active_ = false;
    st.metrics.in_flight(-1);
  }
  std::string out;
  if (stream_open && job_ && !job_->complete()) job_->fail(msg, out);
  job_.reset();
  return out;
}

void Generation::on_client_gone() {
  if (!active_) return;
  Server::State& st = s_.st_;
  active_ = false;
  st.metrics.in_flight(-1);
  st.metrics.disconnect();
  st.metrics.request_done(s_.label_, 499);
  s_.log_access(499);
  for (int k = 0; job_ && k < job_->num_subs() && size_t(k) < ids_.size(); ++k)
    if (job_->engine_active(k)) st.engine->abort(ids_[size_t(k)]);
  ++gen_;
  job_.reset();
  to_store_.reset();
}

}  // namespace beluga::server
