#include "router/response_affinity.h"

#include <cctype>

namespace beluga::router {

void ResponseAffinity::put(const std::string& id, int replica) {
  if (capacity_ == 0 || id.empty()) return;
  std::lock_guard lock(mu_);
  if (auto it = map_.find(id); it != map_.end()) {
    it->second.first = replica;
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return;
  }
  lru_.push_front(id);
  map_.emplace(id, std::make_pair(replica, lru_.begin()));
  while (map_.size() > capacity_) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
}

std::optional<int> ResponseAffinity::get(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.second);
  return it->second.first;
}

std::string find_response_id(std::string_view text) {
  constexpr std::string_view kKey = "\"id\":\"resp_";
  const size_t at = text.find(kKey);
  if (at == std::string_view::npos) return {};
  const size_t begin = at + 6;  // at the `resp_`
  size_t end = begin;
  while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_'))
    ++end;
  if (end == text.size()) return {};  // cut off: not sure it is whole
  return std::string(text.substr(begin, end - begin));
}

}  // namespace beluga::router
