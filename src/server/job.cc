#include "server/job.h"

#include <algorithm>
#include <cstdio>

#include "server/sse.h"
#include "tokenizer/utf8.h"

namespace beluga::server {

using Ev = recipe::ParserEvent;

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

bool StopMatcher::feed(std::string_view text, std::string& out) {
  if (!matched_.empty()) return true;
  held_ += text;
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    size_t p = held_.find(s);
    if (p != std::string::npos && p < best) {
      best = p;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    out.append(held_, 0, best);
    held_.clear();
    return true;
  }
  // Keep the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  out.append(held_, 0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return false;
}

std::string StopMatcher::flush() {
  std::string s;
  s.swap(held_);
  return s;
}

std::string token_text_of_bytes(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = tok::utf8_valid_prefix_len(bytes, i);
    if (n > 0) {
      out.append(bytes, i, n);
      i += n;
      continue;
    }
    char esc[8];
    std::snprintf(esc, sizeof esc, "\\x%02x", unsigned(static_cast<unsigned char>(bytes[i])));
    out += esc;
    ++i;
  }
  return out;
}

namespace {

int64_t code_points(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

Job::Job(JobSpec spec, const tok::Tokenizer& tokenizer, std::unique_ptr<ApiFormatter> fmt, bool stream)
    : spec_(std::move(spec)),
      tok_(tokenizer),
      fmt_(std::move(fmt)),
      stream_(stream),
      start_(std::chrono::steady_clock::now()) {
  const size_t total = size_t(spec_.num_prompts) * size_t(spec_.n);
  seqs_.resize(total);
  choices_.resize(total);
  for (size_t i = 0; i < total; ++i) {
    seqs_[i].decoder = std::make_unique<tok::IncrementalDecoder>(tok_);
    if (spec_.use_parser)
      seqs_[i].parser.emplace(spec_.parser);
    else
      seqs_[i].stop = StopMatcher(spec_.stop);
    choices_[i].index = int(i);
  }
  engine_active_.assign(size_t(spec_.num_prompts), true);
  sub_begun_.assign(size_t(spec_.num_prompts), false);
  sub_prompt_.assign(size_t(spec_.num_prompts), 0);
  sub_cached_.assign(size_t(spec_.num_prompts), 0);
  sub_cached_host_.assign(size_t(spec_.num_prompts), 0);
  sub_cached_disk_.assign(size_t(spec_.num_prompts), 0);
  for (int i = 0; i < spec_.num_prompts && size_t(i) < spec_.prompt_tokens.size(); ++i) {
    sub_prompt_[size_t(i)] = spec_.prompt_tokens[size_t(i)];
    usage_.prompt_tokens += spec_.prompt_tokens[size_t(i)];
  }
}

void Job::feed_text(size_t ci, std::string_view text, std::vector<Ev>& evs, bool& reasoning) {
  Seq& s = seqs_[ci];
  if (s.parser) {
    const size_t before = evs.size();
    s.parser->feed(text, evs);
    for (size_t i = before; i < evs.size(); ++i) reasoning = reasoning || evs[i].kind == Ev::Kind::kReasoning;
    if (s.parser->done()) finish_choice(ci, FinishReason::kStop, false, evs);
    return;
  }
  std::string o;
  const bool hit = s.stop.feed(text, o);
  if (!o.empty()) evs.push_back(Ev{Ev::Kind::kContent, std::move(o), -1});
  if (hit) finish_choice(ci, FinishReason::kStop, false, evs);
}

void Job::finish_choice(size_t ci, FinishReason f, bool from_engine, std::vector<Ev>& evs) {
  Seq& s = seqs_[ci];
  ChoiceText& c = choices_[ci];
  s.done = true;
  const std::string tail = from_engine ? s.decoder->flush() : std::string();
  if (s.parser) {
    if (!tail.empty()) s.parser->feed(tail, evs);
    recipe::FinishReason r = s.parser->finish(f == FinishReason::kLength, evs);
    c.finish = recipe::finish_reason_name(r);
    c.stop_sequence = s.parser->matched_stop();
    return;
  }
  if (from_engine) {
    std::string o;
    bool hit = !tail.empty() && s.stop.feed(tail, o);
    if (!hit) o += s.stop.flush();
    if (!o.empty()) evs.push_back(Ev{Ev::Kind::kContent, std::move(o), -1});
  }
  c.stop_sequence = s.stop.matched();
  c.finish = c.stop_sequence.empty() && f == FinishReason::kLength ? "length" : "stop";
}

void Job::apply(size_t ci, std::vector<Ev>& evs, std::string& out) {
  ChoiceText& c = choices_[ci];
  // Join adjacent deltas of one kind (one engine step may yield several).
  std::vector<Ev> merged;
  for (auto& e : evs) {
    const bool text_kind =
        e.kind == Ev::Kind::kReasoning || e.kind == Ev::Kind::kContent || e.kind == Ev::Kind::kToolCallArgs;
    if (text_kind && e.text.empty()) continue;
    if (text_kind && !merged.empty() && merged.back().kind == e.kind &&
        merged.back().tool_index == e.tool_index) {
      merged.back().text += e.text;
      continue;
    }
    merged.push_back(std::move(e));
  }
  evs.clear();
  for (const auto& e : merged) {
    switch (e.kind) {
      case Ev::Kind::kReasoning:
        c.reasoning += e.text;
        break;
      case Ev::Kind::kContent:
        c.content += e.text;
        break;
      case Ev::Kind::kToolCallBegin:
        while (int(c.calls.size()) <= e.tool_index)
          c.calls.push_back(ToolCallOut{random_id(fmt_->tool_id_prefix()), "", ""});
        if (e.tool_index >= 0) c.calls[size_t(e.tool_index)].name = e.text;
        break;
      case Ev::Kind::kToolCallArgs:
        if (e.tool_index >= 0 && size_t(e.tool_index) < c.calls.size())
          c.calls[size_t(e.tool_index)].arguments += e.text;
        break;
      case Ev::Kind::kToolCallEnd:
        break;
    }
    if (stream_) fmt_->delta(c, e, out);
  }
}

Job::CachedCounts Job::sub_cached(int sub) const {
  const size_t s = size_t(sub);
  return {sub_cached_[s], sub_cached_host_[s], sub_cached_disk_[s]};
}

void Job::on_output(int sub, RequestOutput&& o, std::string& out) {
  if (complete_ || sub < 0 || sub >= spec_.num_prompts) return;
  const size_t s = size_t(sub);
  if (o.prompt_tokens > 0) sub_prompt_[s] = o.prompt_tokens;
  if (s < prefill_cached_.size()) {
    sub_cached_[s] = prefill_cached_[s].tokens;
    sub_cached_host_[s] = prefill_cached_[s].host;
    sub_cached_disk_[s] = prefill_cached_[s].disk;
  } else if (o.cached_tokens >= sub_cached_[s]) {  // known from the first admission on
    sub_cached_[s] = o.cached_tokens;
    sub_cached_host_[s] = o.cached_tokens_host;
    sub_cached_disk_[s] = o.cached_tokens_disk;
  }
  usage_.prompt_tokens = 0;
  usage_.cached_tokens = usage_.cached_tokens_host = usage_.cached_tokens_disk = 0;
  for (size_t i = 0; i < sub_prompt_.size(); ++i) {
    usage_.prompt_tokens += sub_prompt_[i];
    usage_.cached_tokens += sub_cached_[i];
    usage_.cached_tokens_host += sub_cached_host_[i];
    usage_.cached_tokens_disk += sub_cached_disk_[i];
  }
  if (o.finished) engine_active_[s] = false;
  if (!o.error.empty()) {
    unavailable_ = o.unavailable;
    return fail(o.error, out);
  }
  for (const auto& seq : o.seqs)
    if (seq.finish == FinishReason::kError) return fail("the engine failed this request", out);

  if (!begun_) {
    begun_ = true;
    if (stream_) fmt_->begin(usage_, out);
  }
  // Per prompt, not at the job's first output: the engine sends a prompt's logprobs with its own
  // first output, and the echo (with them) must come before the prompt's generated text.
  if (!sub_begun_[s]) {
    sub_begun_[s] = true;
    begin_sub(s, o.prompt_logprobs, out);
  }

  std::vector<Ev> evs;
  for (auto& seq : o.seqs) {
    if (seq.index < 0 || seq.index >= spec_.n) continue;
    const size_t ci = s * size_t(spec_.n) + size_t(seq.index);
    if (seqs_[ci].done) continue;
    evs.clear();
    for (size_t k = 0; k < seq.tokens.size(); ++k) {
      if (!first_token_) first_token_ = std::chrono::steady_clock::now();
      ++choices_[ci].tokens;
      ++usage_.completion_tokens;
      bool reasoning = false;
      const int64_t offset = seqs_[ci].text_chars;
      const std::string text = seqs_[ci].decoder->feed(seq.tokens[k]);
      seqs_[ci].text_chars += code_points(text);
      feed_text(ci, text, evs, reasoning);
      if (reasoning)
        ++choices_[ci].reasoning_tokens;
      else if (spec_.logprobs >= 0 && k < seq.logprobs.size())
        add_logprob(ci, seq.logprobs[k], offset);
      if (seqs_[ci].done) break;
    }
    if (!seqs_[ci].done && seq.finish != FinishReason::kNone) {
      if (seq.finish == FinishReason::kAbort) return fail("the request was aborted", out);
      finish_choice(ci, seq.finish, true, evs);
    }
    apply(ci, evs, out);
    if (seqs_[ci].done && stream_) fmt_->finish(choices_[ci], out);
  }
  if (o.finished) {
    // The engine is done with this prompt: any sequence it did not report finished ends here.
    for (size_t ci = s * size_t(spec_.n); ci < (s + 1) * size_t(spec_.n); ++ci) {
      if (seqs_[ci].done) continue;
      evs.clear();
      finish_choice(ci, FinishReason::kStop, true, evs);
      apply(ci, evs, out);
      if (stream_) fmt_->finish(choices_[ci], out);
    }
  }
  check_complete(out);
}

LogprobAlt Job::alt_of(int id, float logprob) const {
  LogprobAlt a;
  a.bytes = std::string(tok_.token_bytes(id));
  a.token = token_text_of_bytes(a.bytes);
  a.logprob = logprob;
  return a;
}

void Job::add_logprob(size_t ci, const TokenLogprob& lp, int64_t text_offset) {
  TokenLogprobOut t;
  t.chosen = alt_of(lp.token, lp.logprob);
  const size_t k = std::min(lp.top.size(), size_t(std::max(0, spec_.logprobs)));
  for (size_t i = 0; i < k; ++i) t.top.push_back(alt_of(lp.top[i].first, lp.top[i].second));
  t.text_offset = text_offset;
  choices_[ci].logprobs.push_back(std::move(t));
}

void Job::begin_sub(size_t sub, const std::vector<TokenLogprob>& prompt_lps, std::string& out) {
  const bool echo = sub < spec_.echo.size();
  const std::vector<int>* ids = sub < spec_.prompt_ids.size() ? &spec_.prompt_ids[sub] : nullptr;
  // prompt_lps[i] is prompt token i + 1's; the first token has none.
  auto lp_of = [&](size_t i) { return i > 0 && i - 1 < prompt_lps.size() ? &prompt_lps[i - 1] : nullptr; };

  std::optional<PromptLogprobs> vllm;  // the same for every choice of this prompt
  if (spec_.prompt_logprobs >= 0 && ids) {
    vllm.emplace(ids->size());
    for (size_t i = 0; i < ids->size(); ++i) {
      const TokenLogprob* e = lp_of(i);
      if (!e) continue;  // null
      auto& pos = (*vllm)[i];
      auto decoded = [&](int id) { return token_text_of_bytes(tok_.token_bytes(id)); };
      pos.push_back({e->token, e->logprob, e->rank, decoded(e->token)});
      const size_t k = std::min(e->top.size(), size_t(spec_.prompt_logprobs));
      for (size_t j = 0; j < k; ++j)
        pos.push_back({e->top[j].first, e->top[j].second, int(j) + 1, decoded(e->top[j].first)});
    }
  }
  // Completions echo with logprobs: the prompt's tokens lead the choice's logprobs. Offsets are code
  // points of the prompt as decoded, special tokens (a BOS the server added) counting as none.
  std::vector<TokenLogprobOut> echo_lps;
  if (echo && spec_.logprobs >= 0 && ids) {
    tok::IncrementalDecoder dec(tok_, /*skip_special=*/true);
    int64_t chars = 0;
    for (size_t i = 0; i < ids->size(); ++i) {
      TokenLogprobOut t;
      const TokenLogprob* e = lp_of(i);
      t.chosen = alt_of((*ids)[i], e ? e->logprob : 0.0f);
      t.no_logprob = !e;
      if (e) {
        const size_t k = std::min(e->top.size(), size_t(spec_.logprobs));
        for (size_t j = 0; j < k; ++j) t.top.push_back(alt_of(e->top[j].first, e->top[j].second));
      }
      t.text_offset = chars;
      chars += code_points(dec.feed((*ids)[i]));
      echo_lps.push_back(std::move(t));
    }
  }
  for (size_t ci = sub * size_t(spec_.n); ci < (sub + 1) * size_t(spec_.n); ++ci) {
    if (vllm) choices_[ci].prompt_logprobs = vllm;
    if (!echo) continue;
    choices_[ci].logprobs.insert(choices_[ci].logprobs.end(), echo_lps.begin(), echo_lps.end());
    seqs_[ci].text_chars += code_points(spec_.echo[sub]);
    std::vector<Ev> evs{Ev{Ev::Kind::kContent, spec_.echo[sub], -1}};
    apply(ci, evs, out);  // a stream sends the echo, and its logprobs, in the choice's first chunk
  }
}

void Job::check_complete(std::string& out) {
  for (const auto& s : seqs_)
    if (!s.done) return;
  complete_ = true;
  usage_.reasoning_tokens = 0;
  for (const auto& c : choices_) usage_.reasoning_tokens += c.reasoning_tokens;
  if (stream_) fmt_->end(choices_, usage_, out);
}

void Job::fail(const std::string& message, std::string& out) {
  if (complete_) return;
  complete_ = failed_ = true;
  error_ = message;
  if (stream_) fmt_->error(message, out);
}

}  // namespace beluga::server
