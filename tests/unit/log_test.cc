// util/log: level names, where the level comes from (--log-level over BELUGA_LOG_LEVEL over info),
// the line format, filtering by level, and whole lines from concurrent writers.
#include "util/log.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace beluga {
namespace {

// Points the sink at a temporary file and restores sink, level and BELUGA_LOG_LEVEL afterwards.
class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = std::tmpfile();
    ASSERT_NE(file_, nullptr);
    prev_sink_ = log::set_sink(file_);
    prev_level_ = log::level();
    if (const char* e = std::getenv("BELUGA_LOG_LEVEL")) prev_env_ = e;
    ::unsetenv("BELUGA_LOG_LEVEL");
  }
  void TearDown() override {
    log::set_sink(prev_sink_);
    log::set_level(prev_level_);
    if (prev_env_)
      ::setenv("BELUGA_LOG_LEVEL", prev_env_->c_str(), 1);
    else
      ::unsetenv("BELUGA_LOG_LEVEL");
    std::fclose(file_);
  }
  std::string written() {
    std::fflush(file_);
    std::rewind(file_);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file_)) > 0) out.append(buf, n);
    return out;
  }

  std::FILE* file_ = nullptr;
  std::FILE* prev_sink_ = nullptr;
  log::Level prev_level_ = log::Level::kInfo;
  std::optional<std::string> prev_env_;
};

TEST_F(LogTest, ParsesTheFourLevels) {
  EXPECT_EQ(log::parse_level("error"), log::Level::kError);
  EXPECT_EQ(log::parse_level("warn"), log::Level::kWarn);
  EXPECT_EQ(log::parse_level("warning"), log::Level::kWarn);
  EXPECT_EQ(log::parse_level("info"), log::Level::kInfo);
  EXPECT_EQ(log::parse_level("debug"), log::Level::kDebug);
  EXPECT_FALSE(log::parse_level("INFO"));
  EXPECT_FALSE(log::parse_level("trace"));
  EXPECT_FALSE(log::parse_level(""));
  for (auto l : {log::Level::kError, log::Level::kWarn, log::Level::kInfo, log::Level::kDebug})
    EXPECT_EQ(log::parse_level(log::level_name(l)), l);
}

TEST_F(LogTest, FlagOverridesEnvironmentOverridesDefault) {
  EXPECT_EQ(log::level_from(std::nullopt), log::Level::kInfo);
  ::setenv("BELUGA_LOG_LEVEL", "debug", 1);
  EXPECT_EQ(log::level_from(std::nullopt), log::Level::kDebug);
  EXPECT_EQ(log::level_from(std::string("error")), log::Level::kError);
  ::setenv("BELUGA_LOG_LEVEL", "loud", 1);
  try {
    log::level_from(std::nullopt);
    ADD_FAILURE() << "a bad BELUGA_LOG_LEVEL was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("BELUGA_LOG_LEVEL must be error, warn, info or debug (got 'loud')"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(log::level_from(std::string("warn")), log::Level::kWarn);  // the flag wins, env unread
  EXPECT_THROW(log::level_from(std::string("verbose")), Error);
}

TEST_F(LogTest, LineFormatNamesComponentAndLevel) {
  EXPECT_EQ(log::format_line(log::Level::kInfo, "serve", "listening"), "beluga serve: listening\n");
  EXPECT_EQ(log::format_line(log::Level::kWarn, "router", "replica x ejected"),
            "beluga router: warning: replica x ejected\n");
  EXPECT_EQ(log::format_line(log::Level::kError, "serve", "accept failed"),
            "beluga serve: error: accept failed\n");
  EXPECT_EQ(log::format_line(log::Level::kDebug, "router", "retry"), "beluga router: debug: retry\n");
}

TEST_F(LogTest, WritesOnlyLinesAtOrAboveTheLevel) {
  log::set_level(log::Level::kWarn);
  EXPECT_TRUE(log::enabled(log::Level::kError));
  EXPECT_TRUE(log::enabled(log::Level::kWarn));
  EXPECT_FALSE(log::enabled(log::Level::kInfo));
  log::error("serve", "e ", 1);
  log::warn("serve", "w ", 2.5);
  log::info("serve", "i");
  log::debug("serve", "d");
  EXPECT_EQ(written(), "beluga serve: error: e 1\nbeluga serve: warning: w 2.5\n");

  log::set_level(log::Level::kDebug);
  log::debug("router", "now ", "shown");
  log::set_level(log::Level::kError);
  log::warn("router", "hidden");
  EXPECT_EQ(written(),
            "beluga serve: error: e 1\nbeluga serve: warning: w 2.5\nbeluga router: debug: now shown\n");
}

TEST_F(LogTest, ConcurrentWritersNeverSplitALine) {
  log::set_level(log::Level::kInfo);
  constexpr int kThreads = 8, kLines = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < kLines; ++i)
        log::info("serve", "thread ", t, " line ", i, " ", std::string(64, 'x'));
    });
  for (auto& th : threads) th.join();
  const std::string out = written();
  std::set<std::string> lines;
  size_t pos = 0, count = 0;
  while (pos < out.size()) {
    const size_t end = out.find('\n', pos);
    ASSERT_NE(end, std::string::npos);
    const std::string line = out.substr(pos, end - pos);
    ASSERT_EQ(line.rfind("beluga serve: thread ", 0), 0u) << line;
    ASSERT_EQ(line.substr(line.size() - 65), " " + std::string(64, 'x')) << line;
    lines.insert(line);
    ++count;
    pos = end + 1;
  }
  EXPECT_EQ(count, size_t(kThreads * kLines));
  EXPECT_EQ(lines.size(), count);  // each one once
}

}  // namespace
}  // namespace beluga
