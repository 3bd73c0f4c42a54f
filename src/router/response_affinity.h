// Stored Responses live on the replica that produced them: response id -> replica id, so a request
// naming `previous_response_id` (and GET / DELETE /v1/responses/{id}) goes back there. Bounded (least
// recently used dropped first). Thread-safe.
#pragma once

#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace beluga::router {

class ResponseAffinity {
 public:
  explicit ResponseAffinity(size_t capacity) : capacity_(capacity) {}
  void put(const std::string& response_id, int replica);
  std::optional<int> get(const std::string& response_id);

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  std::unordered_map<std::string, std::pair<int, std::list<std::string>::iterator>> map_;
};

// The first `"id":"resp_…"` in `text` (a Responses body or its first stream events), or empty.
std::string find_response_id(std::string_view text);

}  // namespace beluga::router
