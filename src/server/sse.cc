#include "server/sse.h"

#include <chrono>
#include <cstdio>
#include <random>

namespace beluga::server {

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string sse_data(const nlohmann::ordered_json& j) {
  std::string s = "data: ";
  s += dump_json(j);
  s += "\n\n";
  return s;
}

std::string sse_event(std::string_view type, const nlohmann::ordered_json& j) {
  std::string s = "event: ";
  s += type;
  s += "\ndata: ";
  s += dump_json(j);
  s += "\n\n";
  return s;
}

std::string random_id(std::string_view prefix, size_t len) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s(prefix);
  for (size_t i = 0; i < len; ++i) s += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return s;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string http_chunk(std::string_view data) {
  char head[24];
  std::snprintf(head, sizeof(head), "%zx\r\n", data.size());
  std::string s = head;
  s += data;
  s += "\r\n";
  return s;
}

}  // namespace beluga::server
