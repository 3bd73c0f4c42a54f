// Progress (util/progress.h) and ProgressSource (loader/progress_source.h): plain mode prints a line
// at each quarter and a final line; terminal mode redraws one line in place; the source advances by
// the bytes of every distinct tensor it hands out, so a load never counts past the checkpoint's total.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "loader/progress_source.h"
#include "loader/weight_source.h"
#include "util/progress.h"

namespace beluga {
namespace {

std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[512];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(Progress, PlainModePrintsEachQuarterOnceAndAFinalLine) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress p("loading m", 1000, Progress::Unit::kBytes, f, /*terminal=*/0);
    for (int i = 0; i < 100; ++i) p.advance(10);
    EXPECT_EQ(p.done(), 1000u);
  }  // the destructor finishes it
  const std::string out = read_all(f);
  std::fclose(f);
  EXPECT_EQ(count(out, "\n"), 4) << out;  // 25, 50, 75 % and the final line
  EXPECT_EQ(count(out, "loading m: 25%"), 1) << out;
  EXPECT_EQ(count(out, "loading m: 75%"), 1) << out;
  EXPECT_NE(out.find("100%"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << "no carriage returns in a log";
}

TEST(Progress, TerminalModeRedrawsOneLine) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  Progress p("loading m", 2'000'000'000, Progress::Unit::kBytes, f, /*terminal=*/1);
  p.advance(1'000'000'000);
  p.finish();
  p.advance(5);  // after finish: ignored
  const std::string out = read_all(f);
  std::fclose(f);
  EXPECT_EQ(count(out, "\n"), 1) << out;
  EXPECT_GE(count(out, "\r"), 1) << out;
  EXPECT_NE(out.find("[###############...............]  50%  1.00 GB / 2.00 GB"), std::string::npos) << out;
  EXPECT_EQ(p.done(), 1'000'000'000u);
}

TEST(Progress, NoOutputStreamStillCounts) {
  Progress p("x", 0, Progress::Unit::kCount, nullptr);
  p.advance(3);
  p.finish();
  EXPECT_EQ(p.done(), 3u);
}

TEST(ProgressSource, AdvancesByTheBytesOfEachTensorHandedOut) {
  DummyWeights inner;
  Progress p("x", 0, Progress::Unit::kBytes, nullptr);
  ProgressSource src(inner, p);
  Tensor a = src.get("a.weight", {4, 8}, DType::kBF16);
  Tensor b = src.find("b.norm.weight", {16}, DType::kF32);
  Tensor none = src.find("c.bias", {16}, DType::kBF16);  // absent in a dummy source: counts nothing
  EXPECT_TRUE(none.empty());
  src.get("a.weight", {4, 8}, DType::kBF16);  // asked for again (a shared tensor): counted once
  EXPECT_EQ(p.done(), a.nbytes() + b.nbytes());
  EXPECT_EQ(p.done(), size_t(4 * 8 * 2 + 16 * 4));
  EXPECT_EQ(src.total_bytes(), inner.total_bytes());
}

}  // namespace
}  // namespace beluga
