#include "util/progress.h"

#include <unistd.h>

#include <algorithm>

namespace beluga {

Progress::Progress(std::string label, uint64_t total, Unit unit, std::FILE* out, int terminal)
    : label_(std::move(label)),
      total_(total),
      unit_(unit),
      out_(out),
      terminal_(terminal < 0 ? (out && isatty(fileno(out))) : terminal != 0),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (!finished_) finish();
}

std::string Progress::amount(uint64_t v) const {
  if (unit_ == Unit::kCount) return std::to_string(v);
  char buf[32];
  const double gb = double(v) / 1e9;
  if (gb >= 1)
    std::snprintf(buf, sizeof buf, "%.2f GB", gb);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", double(v) / 1e6);
  return buf;
}

void Progress::advance(uint64_t n) {
  if (finished_) return;
  done_ += n;
  if (!out_) return;
  if (terminal_) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    draw(false);
    return;
  }
  if (total_ == 0) return;
  const int quarters = int(std::min<uint64_t>(3, done_ * 4 / total_));
  while (quarters_shown_ < quarters) {
    ++quarters_shown_;
    std::fprintf(out_, "%s: %d%% (%s of %s)\n", label_.c_str(), quarters_shown_ * 25, amount(done_).c_str(),
                 amount(total_).c_str());
  }
  std::fflush(out_);
}

void Progress::draw(bool final) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = label_;
  if (total_ > 0) {
    constexpr int kWidth = 30;
    const double f = std::min(1.0, double(done_) / double(total_));
    const int filled = int(f * kWidth);
    line += " [" + std::string(size_t(filled), '#') + std::string(size_t(kWidth - filled), '.') + "] ";
    char pct[16];
    std::snprintf(pct, sizeof pct, "%3d%%  ", int(f * 100));
    line += pct + amount(done_) + " / " + amount(total_);
  } else {
    line += ": " + amount(done_);
  }
  char t[32];
  std::snprintf(t, sizeof t, "  %.1f s", secs);
  line += t;
  if (terminal_)
    std::fprintf(out_, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  else
    std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (out_) draw(true);
}

}  // namespace beluga
