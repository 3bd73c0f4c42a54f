#include "server/response_store.h"

#include <atomic>
#include <vector>

namespace beluga::server {

using Json = nlohmann::ordered_json;

namespace {

// The chain oldest first (iterative: chains may be long).
std::vector<const StoredResponse*> chain_of(const StoredResponse* last) {
  std::vector<const StoredResponse*> chain;
  for (const StoredResponse* r = last; r; r = r->previous.get()) chain.push_back(r);
  return {chain.rbegin(), chain.rend()};
}

void append_items(Json& to, const Json& items) {
  if (!items.is_array()) return;
  for (const auto& it : items) to.push_back(it);
}

}  // namespace

StoredResponse::~StoredResponse() {
  std::shared_ptr<const StoredResponse> p = std::move(previous);
  // While this is the last owner of the next older turn, take that turn's own link first, so that
  // destroying it does not recurse.
  while (p && p.use_count() == 1) {
    // Orders the write below after other threads' last reads through their (now released) owners.
    std::atomic_thread_fence(std::memory_order_acquire);
    // Every StoredResponse is created non-const (make_shared<StoredResponse>), so this is sound.
    std::shared_ptr<const StoredResponse> older = std::move(const_cast<StoredResponse&>(*p).previous);
    p = std::move(older);
  }
}

const std::string& StoredResponse::id() const {
  return response.at("id").get_ref<const std::string&>();
}

Json StoredResponse::conversation() const {
  Json items = Json::array();
  for (const StoredResponse* r : chain_of(this)) {
    append_items(items, r->input);
    if (r->response.contains("output")) append_items(items, r->response["output"]);
  }
  return items;
}

ResponseStore::ResponseStore(size_t capacity) : capacity_(capacity) {}

void ResponseStore::put(std::shared_ptr<const StoredResponse> r) {
  if (capacity_ == 0 || !r) return;
  const std::string id = r->id();
  // Entries evicted here are released after the lock: freeing a long chain is not free.
  Lru dropped;
  {
    std::lock_guard lock(mu_);
    if (auto it = by_id_.find(id); it != by_id_.end()) {
      dropped.splice(dropped.end(), lru_, it->second);
      by_id_.erase(it);
    }
    lru_.push_front(std::move(r));
    by_id_[id] = lru_.begin();
    while (lru_.size() > capacity_) {
      by_id_.erase(lru_.back()->id());
      dropped.splice(dropped.end(), lru_, std::prev(lru_.end()));
    }
  }
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id, const std::string& tenant) {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || (*it->second)->tenant != tenant) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return *it->second;
}

bool ResponseStore::erase(const std::string& id, const std::string& tenant) {
  std::shared_ptr<const StoredResponse> dropped;  // released after the lock
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || (*it->second)->tenant != tenant) return false;
  dropped = std::move(*it->second);
  lru_.erase(it->second);
  by_id_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

}  // namespace beluga::server
