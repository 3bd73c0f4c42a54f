// Stored OpenAI Responses (`store: true`, OpenAI's default): what `previous_response_id` continues and
// GET / DELETE /v1/responses/{id} read. In memory only (a restart forgets them, as in vLLM), bounded
// by a count of responses with least-recently-used eviction, safe to call from any thread.
//
// Each response belongs to a tenant (the API key its request presented); for any other tenant it
// does not exist, exactly as an unknown id does, so ids reveal nothing across tenants.
//
// A response keeps only its own input items and holds its previous response, so a chain of N turns
// costs O(N) memory, not O(N^2). A response evicted (or deleted) while a later one still continues
// it can no longer be looked up by its id, but stays part of the later response's conversation.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace beluga::server {

struct StoredResponse {
  std::string tenant;
  nlohmann::ordered_json response;                 // the response object, as POST returned it
  nlohmann::ordered_json input;                    // this request's own input items (no instructions)
  std::shared_ptr<const StoredResponse> previous;  // the response it continued, or null

  StoredResponse() = default;
  StoredResponse(const StoredResponse&) = delete;
  StoredResponse& operator=(const StoredResponse&) = delete;
  // Releases the chain turn by turn (the implicit destructor would recurse once per turn).
  ~StoredResponse();

  const std::string& id() const;
  // What a follow-up continues, as Responses input items: the input items of the whole chain, each
  // followed by its response's output items. Instructions are never part of it (OpenAI semantics).
  nlohmann::ordered_json conversation() const;
};

class ResponseStore {
 public:
  // Keeps at most `capacity` responses (0: stores nothing).
  explicit ResponseStore(size_t capacity);
  ResponseStore(const ResponseStore&) = delete;
  ResponseStore& operator=(const ResponseStore&) = delete;

  // Stores under the response's "id" (replacing an entry of that id), as the most recently used;
  // evicts the least recently used beyond the capacity.
  void put(std::shared_ptr<const StoredResponse> r);
  // The response with `id` when `tenant` owns it (and marks it used), else null.
  std::shared_ptr<const StoredResponse> get(const std::string& id, const std::string& tenant);
  // Deletes the response with `id` when `tenant` owns it; false when there is none.
  bool erase(const std::string& id, const std::string& tenant);

  size_t size() const;
  size_t capacity() const { return capacity_; }

 private:
  using Lru = std::list<std::shared_ptr<const StoredResponse>>;  // most recently used first

  const size_t capacity_;
  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<std::string, Lru::iterator> by_id_;
};

}  // namespace beluga::server
