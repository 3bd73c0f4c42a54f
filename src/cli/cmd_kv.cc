// `beluga kv stats --kv-disk-dir DIR [--json]`: what a KV directory holds (blocks, bytes, by class,
// the oldest last use). `beluga kv gc --kv-disk-dir DIR [--kv-retention ...] [--now UNIX_SECONDS]
// [--json]`: removes the blocks past their class's retention as of --now (default: now; retention
// as `serve` takes it, same defaults), and the temporary files of writers that are gone (a server
// killed mid-write; judged by the real clock and the writer's pid, never by --now). Counts are blocks.
#include <cstdio>
#include <ctime>
#include <map>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flag_table.h"
#include "kvstore/retention.h"
#include "kvstore/store_scan.h"
#include "util/error.h"

namespace beluga::cli {

namespace {

std::string iso_time(int64_t t) {
  char buf[32];
  const time_t tt = time_t(t);
  struct tm tm {};
  gmtime_r(&tt, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int kv_stats(const Args& args) {
  const std::string dir = args.require("kv-disk-dir");
  const bool json = args.has("json");
  args.check_all_used();
  struct Usage {
    int64_t blocks = 0, bytes = 0, oldest = 0;
  };
  Usage all;
  std::map<std::string, Usage> by_class;
  std::map<std::string, int64_t> models;
  int64_t invalid = 0;
  kv::scan_store(
      dir,
      [&](const kv::ScannedBlock& b) {
        for (Usage* u : {&all, &by_class[b.header.cls]}) {
          u->blocks++;
          u->bytes += int64_t(b.bytes);
          u->oldest = u->oldest == 0 ? b.last_used : std::min(u->oldest, b.last_used);
        }
        models[kv::key_hex(b.header.fingerprint)]++;
      },
      &invalid);
  const kv::TempFiles temps = kv::scan_temp_files(dir, false);
  if (json) {
    nlohmann::ordered_json j;
    j["blocks"] = all.blocks;
    j["bytes"] = all.bytes;
    j["oldest_last_used"] = all.blocks ? nlohmann::json(all.oldest) : nlohmann::json(nullptr);
    j["models"] = models.size();
    j["invalid_files"] = invalid;
    j["partial_files"] = temps.total;
    j["abandoned_partial_files"] = temps.abandoned;
    j["by_class"] = nlohmann::ordered_json::object();
    for (const auto& [cls, u] : by_class)
      j["by_class"][cls] = {{"blocks", u.blocks}, {"bytes", u.bytes}, {"oldest_last_used", u.oldest}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%-16s %10s %14s  %s\n", "class", "blocks", "bytes", "oldest last use");
  for (const auto& [cls, u] : by_class)
    std::printf("%-16s %10lld %14lld  %s\n", cls.c_str(), static_cast<long long>(u.blocks),
                static_cast<long long>(u.bytes), iso_time(u.oldest).c_str());
  std::printf("%-16s %10lld %14lld  %s\n", "total", static_cast<long long>(all.blocks),
              static_cast<long long>(all.bytes), all.blocks ? iso_time(all.oldest).c_str() : "-");
  std::printf("%zu model(s), %lld invalid file(s), %lld partial file(s) (%lld of writers gone)\n",
              models.size(), static_cast<long long>(invalid), static_cast<long long>(temps.total),
              static_cast<long long>(temps.abandoned));
  return 0;
}

int kv_gc(const Args& args) {
  const std::string dir = args.require("kv-disk-dir");
  const kv::Retention retention = kv::parse_retention(args.get_or("kv-retention", ""));
  const long now = args.get_int("now", long(::time(nullptr)));
  const bool json = args.has("json");
  args.check_all_used();
  struct Count {
    int64_t removed = 0, kept = 0;
  };
  Count all;
  std::map<std::string, Count> by_class;
  int64_t failed = 0;
  kv::scan_store(dir, [&](const kv::ScannedBlock& b) {
    Count& c = by_class[b.header.cls];
    if (int64_t(now) - b.last_used > retention.of(b.header.cls)) {
      if (::unlink(b.path.c_str()) == 0) {
        c.removed++;
        all.removed++;
        return;
      }
      failed++;  // still there: counted as kept
    }
    c.kept++;
    all.kept++;
  });
  const kv::TempFiles temps = kv::scan_temp_files(dir, true);
  if (json) {
    nlohmann::ordered_json j;
    j["removed"] = all.removed;
    j["kept"] = all.kept;
    j["by_class"] = nlohmann::ordered_json::object();
    for (const auto& [cls, c] : by_class) j["by_class"][cls] = {{"removed", c.removed}, {"kept", c.kept}};
    j["partial_files_removed"] = temps.removed;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%-16s %10s %10s %10s\n", "class", "retention", "removed", "kept");
    for (const auto& [cls, c] : by_class)
      std::printf("%-16s %10s %10lld %10lld\n", cls.c_str(), kv::format_duration(retention.of(cls)).c_str(),
                  static_cast<long long>(c.removed), static_cast<long long>(c.kept));
    std::printf("%-16s %10s %10lld %10lld\n", "total", "", static_cast<long long>(all.removed),
                static_cast<long long>(all.kept));
    std::printf("%lld partial file(s) of writers gone removed\n", static_cast<long long>(temps.removed));
  }
  if (temps.removed < temps.abandoned)
    std::fprintf(stderr, "beluga kv gc: %lld partial file(s) could not be removed\n",
                 static_cast<long long>(temps.abandoned - temps.removed));
  if (failed)
    std::fprintf(stderr, "beluga kv gc: %lld expired file(s) could not be removed\n",
                 static_cast<long long>(failed));
  return 0;
}

}  // namespace

int cmd_kv(int argc, char** argv) {
  const std::string usage = usage_text(usage_of("kv"));
  if (argc < 1 || std::string(argv[0]) == "--help" || std::string(argv[0]) == "help") {
    std::fputs(usage.c_str(), argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  const std::string sub = argv[0];
  if (sub == "stats") return kv_stats(Args::for_command(argc - 1, argv + 1, "kv stats"));
  if (sub == "gc") return kv_gc(Args::for_command(argc - 1, argv + 1, "kv gc"));
  throw Error(str("unknown `beluga kv` command '", sub, "'\n", usage));
}

}  // namespace beluga::cli
