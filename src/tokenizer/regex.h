// A compiled pre-tokenizer regex (PCRE2, UTF + Unicode properties, JIT when available).
// Patterns in tokenizer.json are written for Oniguruma (what Hugging Face uses); the few places
// where PCRE2 reads them differently are translated at compile time (onig_to_pcre2).
// Matching is thread-safe: per-thread match data and JIT stacks are kept in thread-local storage.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace beluga::tok {

class Regex {
 public:
  // `literal` compiles the pattern as a plain string (Split with {"String": ...}).
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match in subject (valid UTF-8) at or after `start`; subject is the whole string
  // the pattern sees (lookarounds stop at its ends). Returns false if there is none.
  bool find(std::string_view subject, size_t start, size_t& match_begin, size_t& match_end) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  struct Code;
  std::unique_ptr<Code> code_;
};

// Rewrites an Oniguruma pattern into the PCRE2 pattern that matches the same strings (exposed for tests).
std::string onig_to_pcre2(const std::string& pattern);

}  // namespace beluga::tok
