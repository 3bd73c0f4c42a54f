// multipleOf as a digit automaton: with multipleOf = p / 10^q (a finite decimal, p an integer), a
// number x is a multiple exactly when x * 10^q is an integer divisible by p, i.e. when the digits of x,
// read left to right with the fraction padded to q digits, leave remainder 0 mod p (and every fraction
// digit past the q-th is 0). The automaton's states (remainder, fraction digits read) become
// right-linear rules, one per state; decimal arithmetic is exact, as the specification means.
#include <cmath>
#include <map>
#include <string>

#include "grammar/json_schema_compiler.h"
#include "util/error.h"

namespace beluga::grammar::detail {

namespace {

constexpr int64_t kMaxModulus = 10000;
constexpr int kMaxScale = 8;

// The shortest decimal spelling of a positive number as p / 10^q; false when it is not one we take.
bool as_decimal(const Json& v, int64_t& p, int& q) {
  std::string t = v.dump();
  size_t e = t.find_first_of("eE");
  int exp = e == std::string::npos ? 0 : std::stoi(t.substr(e + 1));
  std::string mant = t.substr(0, e), digits;
  q = 0;
  bool frac = false;
  for (char c : mant) {
    if (c == '.') {
      frac = true;
    } else if (c >= '0' && c <= '9') {
      digits += c;
      q += frac;
    } else {
      return false;
    }
  }
  q -= exp;
  while (q < 0) digits += '0', ++q;
  size_t nz = digits.find_first_not_of('0');
  if (nz == std::string::npos) return false;
  digits = digits.substr(nz);
  while (q > 0 && digits.size() > 1 && digits.back() == '0') digits.pop_back(), --q;
  if (digits.size() > 6) return false;
  p = std::stoll(digits);
  return p <= kMaxModulus && q <= kMaxScale;
}

}  // namespace

int SchemaCompiler::gen_multiple_of(const Json& s, const std::string& path, bool integer, bool zero_frac_ok) {
  const Json& m = s["multipleOf"];
  BELUGA_CHECK(m.is_number() && m.get<double>() > 0, "multipleOf at ", path, " must be a number above 0");
  // Bounds: only an inclusive 0 (the sign), which is what "not x < 0" (if/else) leaves.
  Bound lo = bound(s, true, path), hi = bound(s, false, path);
  for (const Bound* b : {&lo, &hi})
    if (b->v && (*b->v != 0 || b->excl))
      refuse("multipleOf", path,
             std::string("multipleOf together with ") + (b == &lo ? "a lower" : "an upper") +
                 " bound other than an inclusive 0 is not supported");
  int64_t p = 0;
  int q = 0;
  if (!as_decimal(m, p, q))
    refuse("multipleOf", path,
           "only multiples of p/10^q with p <= " + std::to_string(kMaxModulus) +
               " and q <= " + std::to_string(kMaxScale) + " are supported, not " + m.dump());
  if (p * (q + 2) > 40000) refuse("multipleOf", path, "the digit automaton would be too large");
  // pow10[k] = 10^k mod p, to test "remainder r with k fraction digits still to pad".
  std::vector<int64_t> pow10(q + 1, 1 % p);
  for (int k = 1; k <= q; ++k) pow10[k] = pow10[k - 1] * 10 % p;
  auto done = [&](int64_t r, int f) { return r * pow10[q - f] % p == 0; };
  // Rules: I(r) inside the integer part; G(r, f) after '.' and f >= 1 fraction digits.
  std::vector<int> irule(p), grule(size_t(p) * (q + 1), -1);
  for (int64_t r = 0; r < p; ++r) irule[r] = g_.add_rule(path + "/multipleOf:i" + std::to_string(r));
  auto g_rule = [&](int64_t r, int f) -> int {
    int& x = grule[size_t(f) * p + r];
    if (x < 0) x = g_.add_rule(path + "/multipleOf:f" + std::to_string(f) + ":" + std::to_string(r));
    return x;
  };
  // Digits from remainder r, grouped by the state they lead to.
  auto step = [&](int64_t r, ByteSet allowed, auto target) {
    std::map<int64_t, ByteSet> by;
    for (int d = 0; d <= 9; ++d)
      if (allowed.has('0' + d)) by[(r * 10 + d) % p].set('0' + d);
    std::vector<int> alts;
    for (auto& [t, set] : by) alts.push_back(g_.seq({g_.bytes(set), g_.ref(target(t))}));
    return alts;
  };
  ByteSet all = ByteSet::range('0', '9');
  ByteSet frac_digits = integer ? ByteSet::of("0") : all;
  // After the integer part with remainder r: the end, or a fraction.
  auto after_int = [&](int64_t r) {
    std::vector<int> alts;
    if (done(r, 0)) alts.push_back(g_.empty());
    if (zero_frac_ok && q == 0) alts.push_back(g_.seq({lit(".0"), g_.ref(g_rule(r, 0))}));
    if (zero_frac_ok && q > 0)
      alts.push_back(
          g_.seq({lit("."), g_.choice(step(r, frac_digits, [&](int64_t t) { return g_rule(t, 1); }))}));
    return g_.choice(std::move(alts));
  };
  for (int64_t r = 0; r < p; ++r) {
    std::vector<int> alts = step(r, all, [&](int64_t t) { return irule[t]; });
    alts.push_back(after_int(r));
    g_.define(irule[r], g_.choice(std::move(alts)));
  }
  // G(r, f): f fraction digits read (f == 0 stands for "q == 0": only zeros follow).
  for (int f = q > 0 ? 1 : 0; f <= q; ++f)
    for (int64_t r = 0; r < p; ++r) {
      int rule = grule[size_t(f) * p + r];
      if (rule < 0) continue;
      std::vector<int> alts;
      if (done(r, f)) alts.push_back(g_.empty());
      if (f < q) {
        auto more = step(r, frac_digits, [&](int64_t t) { return g_rule(t, f + 1); });
        alts.insert(alts.end(), more.begin(), more.end());
      } else {
        alts.push_back(g_.seq({lit("0"), g_.ref(rule)}));
      }
      g_.define(rule, g_.choice(std::move(alts)));
    }
  // "0", or a first digit 1-9 (no leading zeros).
  int first = g_.choice({g_.seq({lit("0"), after_int(0)}),
                         g_.choice(step(0, ByteSet::range('1', '9'), [&](int64_t t) { return irule[t]; }))});
  if (!lo.v && !hi.v) return g_.seq({g_.optional(lit("-")), first});
  if (!hi.v) return first;  // x >= 0: no sign
  int zero = g_.seq(
      {lit("0"), zero_frac_ok ? g_.optional(g_.seq({lit("."), g_.repeat(lit("0"), 1, -1)})) : g_.empty()});
  return lo.v ? zero : g_.choice({g_.seq({lit("-"), first}), zero});  // x <= 0: negative or zero
}

}  // namespace beluga::grammar::detail
