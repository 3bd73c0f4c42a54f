#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "util/error.h"

namespace beluga::tok {

namespace {

std::string pcre2_error(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread matching state shared by all patterns: match data (one ovector pair is all we read)
// and a JIT stack large enough for long runs such as `\s+(?!\S)` over megabytes of spaces.
struct ThreadState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadState() {
    data = pcre2_match_data_create(1, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (!data || !ctx || !stack) throw Error("pcre2: out of memory");
    pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~ThreadState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(data);
  }
  ThreadState(const ThreadState&) = delete;
  ThreadState& operator=(const ThreadState&) = delete;
};

ThreadState& thread_state() {
  thread_local ThreadState s;
  return s;
}

}  // namespace

// Patterns in tokenizer.json use Oniguruma syntax. The constructs tokenizers ship (\p{..} classes,
// (?i:..), lookahead, \s — which with PCRE2_UCP also covers U+0085 like Oniguruma's White_Space)
// read the same in PCRE2; the one escape that means something else is \h (hex digit in Oniguruma,
// horizontal space in PCRE2).
std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  int class_depth = 0;  // Oniguruma allows nested classes; PCRE2 posix-style [[:..:]] never occurs here
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      if (e == 'h' || e == 'H') {
        out += e == 'h' ? (class_depth ? "0-9a-fA-F" : "[0-9a-fA-F]") : "[^0-9a-fA-F]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal in both dialects.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, bool literal) : pattern_(pattern), code_(std::make_unique<Code>()) {
  std::string translated = literal ? pattern : onig_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  // PCRE2_LITERAL refuses PCRE2_UCP (which only affects escapes and classes, absent in a literal).
  uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), opts, &err,
                              &off, nullptr);
  BELUGA_CHECK(code_->code, "tokenizer regex /", pattern, "/: ", pcre2_error(err), " at offset ", off);
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

bool Regex::find(std::string_view subject, size_t start, size_t& match_begin, size_t& match_end) const {
  ThreadState& ts = thread_state();
  auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc;
  if (code_->jit) {
    rc = pcre2_jit_match(code_->code, s, subject.size(), start, 0, ts.data, ts.ctx);
    // Out of JIT stack (pathological input): the interpreter keeps its backtracking on the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_->code, s, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, ts.data,
                       ts.ctx);
  } else {
    rc = pcre2_match(code_->code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, ts.data, ts.ctx);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  // rc == 0 only means the ovector had no room for capture groups; the whole match is still there.
  BELUGA_CHECK(rc >= 0, "tokenizer regex /", pattern_, "/: ", pcre2_error(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ts.data);
  match_begin = ov[0];
  match_end = ov[1];
  return true;
}

}  // namespace beluga::tok
