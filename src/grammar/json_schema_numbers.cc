#include <algorithm>
#include <cmath>

#include "grammar/json_schema_compiler.h"
#include "util/error.h"

namespace beluga::grammar::detail {

namespace {

int64_t checked_int(double x, const char* kw) {
  if (!(std::fabs(x) < 1e18)) throw Refused(kw, std::string(kw) + ": bounds beyond 1e18 are not supported");
  return int64_t(x);
}

}  // namespace

int SchemaCompiler::number_expr() {
  int digit = g_.bytes(ByteSet::range('0', '9'));
  int intpart =
      g_.seq({g_.optional(lit("-")),
              g_.choice({lit("0"), g_.seq({g_.bytes(ByteSet::range('1', '9')), g_.repeat(digit, 0, -1)})})});
  int frac = g_.optional(g_.seq({lit("."), g_.repeat(digit, 1, -1)}));
  int exp = g_.optional(g_.seq(
      {g_.bytes(ByteSet::of("eE")), g_.optional(g_.bytes(ByteSet::of("+-"))), g_.repeat(digit, 1, -1)}));
  return g_.seq({intpart, frac, exp});
}

// Same-length digit strings a <= b (leading zeros allowed): every string between them.
int SchemaCompiler::digit_range(const std::string& a, const std::string& b) {
  if (a.empty()) return g_.empty();
  if (a == b) return lit(a);
  if (a[0] == b[0]) return g_.seq({lit(a.substr(0, 1)), digit_range(a.substr(1), b.substr(1))});
  std::string ra = a.substr(1), rb = b.substr(1);
  bool low_full = ra.find_first_not_of('0') == std::string::npos;
  bool high_full = rb.find_first_not_of('9') == std::string::npos;
  std::vector<int> alts;
  if (!low_full) alts.push_back(g_.seq({lit(a.substr(0, 1)), digit_range(ra, std::string(ra.size(), '9'))}));
  char lo = low_full ? a[0] : char(a[0] + 1), hi = high_full ? b[0] : char(b[0] - 1);
  if (lo <= hi) alts.push_back(g_.seq({g_.bytes(ByteSet::range(lo, hi)), digits(int(ra.size()))}));
  if (!high_full) alts.push_back(g_.seq({lit(b.substr(0, 1)), digit_range(std::string(rb.size(), '0'), rb)}));
  return g_.choice(std::move(alts));
}

// Canonical decimal integers in [lo, hi] (lo >= 0; hi < 0: unbounded).
int SchemaCompiler::nonneg_range(int64_t lo, int64_t hi) {
  if (hi >= 0 && hi < lo) return g_.nothing();
  std::string los = std::to_string(lo);
  std::vector<int> alts;
  size_t maxlen = hi >= 0 ? std::to_string(hi).size() : los.size();
  for (size_t len = los.size(); len <= maxlen; ++len) {
    std::string a = los;
    if (len != los.size()) {
      a.assign(len, '0');
      a[0] = '1';
    }
    std::string b = std::string(len, '9');
    if (hi >= 0 && len == maxlen) b = std::to_string(hi);
    if (a.size() == b.size() && a <= b) alts.push_back(digit_range(a, b));
  }
  if (hi < 0)  // every longer number
    alts.push_back(g_.seq({g_.bytes(ByteSet::range('1', '9')),
                           g_.repeat(g_.bytes(ByteSet::range('0', '9')), int(los.size()), -1)}));
  return g_.choice(std::move(alts));
}

// Integers in [lo, hi]; nullopt: unbounded. Negative numbers as "-" magnitude.
int SchemaCompiler::int_range(std::optional<int64_t> lo, std::optional<int64_t> hi, bool zero_ok_negative) {
  std::vector<int> alts;
  if (!hi || *hi >= 0) alts.push_back(nonneg_range(lo ? std::max<int64_t>(*lo, 0) : 0, hi ? *hi : -1));
  if (!lo || *lo < 0) {
    int64_t mlo = hi && *hi < 0 ? -*hi : (zero_ok_negative ? 0 : 1);
    int64_t mhi = lo ? -*lo : -1;
    if (zero_ok_negative && hi && *hi >= 0) mlo = 0;
    alts.push_back(g_.seq({lit("-"), nonneg_range(mlo, mhi)}));
  }
  return g_.choice(std::move(alts));
}

SchemaCompiler::Bound SchemaCompiler::bound(const Json& s, bool lower, const std::string& path) {
  const char* kw = lower ? "minimum" : "maximum";
  const char* xkw = lower ? "exclusiveMinimum" : "exclusiveMaximum";
  Bound b;
  if (s.contains(kw)) {
    BELUGA_CHECK(s[kw].is_number(), kw, " at ", path, " must be a number");
    b.v = s[kw].get<double>();
  }
  if (s.contains(xkw)) {
    const Json& x = s[xkw];
    if (draft_ == Draft::k4) {
      BELUGA_CHECK(x.is_boolean(), xkw, " at ", path, " must be a boolean in draft 4");
      b.excl = x.get<bool>() && b.v;
    } else {
      BELUGA_CHECK(x.is_number(), xkw, " at ", path, " must be a number");
      double xv = x.get<double>();
      if (!b.v || (lower ? xv >= *b.v : xv <= *b.v)) b.v = xv, b.excl = true;
    }
  }
  return b;
}

int SchemaCompiler::gen_number_not_in(const Json& s, const std::vector<double>& out, const std::string& path,
                                      bool integer) {
  if (s.contains("multipleOf"))
    refuse("not", path, "excluding numbers together with multipleOf is not supported");
  std::vector<double> vs;
  for (double v : out) {
    if (integer && std::floor(v) != v) continue;  // not an integer anyway
    if (std::floor(v) != v) refuse("not", path, "excluding a non-integral number is not supported");
    vs.push_back(v);
  }
  std::sort(vs.begin(), vs.end());
  vs.erase(std::unique(vs.begin(), vs.end()), vs.end());
  // The open intervals (-inf, v0), (v0, v1), ..., (vk, inf).
  std::vector<int> alts;
  for (size_t i = 0; i <= vs.size(); ++i) {
    Bound lo, hi;
    if (i > 0) lo = {vs[i - 1], true};
    if (i < vs.size()) hi = {vs[i], true};
    alts.push_back(gen_number(s, path, integer, lo, hi));
  }
  return g_.choice(std::move(alts));
}

int SchemaCompiler::gen_number(const Json& s, const std::string& path, bool integer) {
  return gen_number(s, path, integer, Bound(), Bound());
}

int SchemaCompiler::gen_number(const Json& s, const std::string& path, bool integer, Bound extra_lo,
                               Bound extra_hi) {
  Bound lo = bound(s, true, path), hi = bound(s, false, path);
  // The tighter of two bounds (at equal values, the exclusive one).
  auto tighter = [](const Bound& a, const Bound& b, bool lower) {
    if (!a.v) return b;
    if (!b.v) return a;
    if (*a.v == *b.v) return a.excl ? a : b;
    return (*b.v > *a.v) == lower ? b : a;
  };
  lo = tighter(lo, extra_lo, true);
  hi = tighter(hi, extra_hi, false);
  int zeros = g_.optional(g_.seq({lit("."), g_.repeat(lit("0"), 1, -1)}));
  bool zero_frac_ok = draft_ != Draft::k4 || !integer;
  // kNonIntegral (a complement of "integer"): draft 4 integers are the spellings without fraction or
  // exponent; in later drafts an integer is a value, and the non-integral ones are written without an
  // exponent (whose value is integral is not a regular property of the digits).
  bool nonint = !integer && s.contains(kNonIntegral);
  if (s.contains("multipleOf")) {
    if (nonint) refuse("not", path, "not \"integer\" together with multipleOf is not supported");
    return gen_multiple_of(s, path, integer, zero_frac_ok);
  }
  if (nonint) zeros = draft_ == Draft::k4 ? g_.seq({lit("."), g_.repeat(lit("0"), 1, -1)}) : g_.nothing();
  if (integer) {
    std::optional<int64_t> l, h;
    if (lo.v) {
      double c = lo.excl ? std::floor(*lo.v) + 1 : std::ceil(*lo.v);
      l = checked_int(c, "minimum");
    }
    if (hi.v) {
      double c = hi.excl ? std::ceil(*hi.v) - 1 : std::floor(*hi.v);
      h = checked_int(c, "maximum");
    }
    if (l && h && *l > *h) return g_.nothing();
    int base = int_range(l, h);
    return zero_frac_ok ? g_.seq({base, zeros}) : base;
  }
  if (!lo.v && !hi.v && !nonint) return number_expr();
  for (const Bound* b : {&lo, &hi})
    if (b->v && std::floor(*b->v) != *b->v)
      refuse(b == &lo ? "minimum" : "maximum", path, "a non-integer bound on a number is not supported");
  if (!lo.v && !hi.v && draft_ == Draft::k4) {  // a fraction or an exponent
    int digit = g_.bytes(ByteSet::range('0', '9'));
    int frac = g_.seq({lit("."), g_.repeat(digit, 1, -1)});
    int exp = g_.seq(
        {g_.bytes(ByteSet::of("eE")), g_.optional(g_.bytes(ByteSet::of("+-"))), g_.repeat(digit, 1, -1)});
    int intpart = g_.seq(
        {g_.optional(lit("-")),
         g_.choice({lit("0"), g_.seq({g_.bytes(ByteSet::range('1', '9')), g_.repeat(digit, 0, -1)})})});
    return g_.seq({intpart, g_.choice({g_.seq({frac, g_.optional(exp)}), exp})});
  }
  std::optional<int64_t> L, H;
  if (lo.v) L = checked_int(*lo.v, "minimum");
  if (hi.v) H = checked_int(*hi.v, "maximum");
  int digit = g_.bytes(ByteSet::range('0', '9'));
  int frac = g_.seq(
      {lit("."), g_.repeat(digit, 0, -1), g_.bytes(ByteSet::range('1', '9')), g_.repeat(digit, 0, -1)});
  auto irange = [&](std::optional<int64_t> a, std::optional<int64_t> b) -> int {  // I in [a, b], I >= 0
    int64_t aa = std::max<int64_t>(a ? *a : 0, 0);
    if (b && *b < aa) return g_.nothing();
    return nonneg_range(aa, b ? *b : -1);
  };
  auto opt_add = [](std::optional<int64_t> x, int64_t d) -> std::optional<int64_t> {
    return x ? std::optional<int64_t>(*x + d) : std::nullopt;
  };
  auto opt_neg = [](std::optional<int64_t> x) -> std::optional<int64_t> {
    return x ? std::optional<int64_t>(-*x) : std::nullopt;
  };
  std::vector<int> alts;
  // value = I (exact) or I + d, 0 < d < 1 (frac), for I >= 0; then the negatives.
  alts.push_back(g_.seq({irange(lo.excl ? opt_add(L, 1) : L, hi.excl ? opt_add(H, -1) : H), zeros}));
  alts.push_back(g_.seq({irange(L, opt_add(H, -1)), frac}));
  {
    // -I >= L  <=>  I <= -L ; -I <= H <=> I >= -H ; I >= 1
    std::optional<int64_t> a = hi.excl ? opt_add(opt_neg(H), 1) : opt_neg(H);
    std::optional<int64_t> b = lo.excl ? opt_add(opt_neg(L), -1) : opt_neg(L);
    if (!a || *a < 1) a = 1;
    alts.push_back(g_.seq({lit("-"), irange(a, b), zeros}));
  }
  // -(I + d) >= L <=> I <= -L - 1 ; -(I + d) <= H <=> I >= -H
  alts.push_back(g_.seq({lit("-"), irange(opt_neg(H), opt_add(opt_neg(L), -1)), frac}));
  return g_.choice(std::move(alts));
}

}  // namespace beluga::grammar::detail
