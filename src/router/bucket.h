// Prefill-length buckets (DeepSeek sorts prefill by context length): replicas grouped by the prompt
// lengths they take. `--bucket NAME:MAX=URL,URL` declares a bucket of prompts up to MAX tokens
// (K = 1024, M = 1024K; `inf` for no limit); a prompt goes to the bucket with the smallest MAX that
// holds it (past every MAX: the largest). A replica may sit in several buckets; one in none takes no
// bucketed generation while a bucket member is available.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "router/policy.h"

namespace beluga::router {

struct BucketSpec {
  std::string name;
  int64_t max_tokens = 0;  // INT64_MAX: no limit
  std::vector<std::string> urls;
};

// Throws beluga::Error naming the mistake.
BucketSpec parse_bucket(std::string_view text);

class Buckets {
 public:
  // `members`: bit r for replica id r. Kept sorted by max_tokens; names must be distinct.
  void add(std::string name, int64_t max_tokens, uint64_t members);
  bool empty() const { return buckets_.empty(); }
  // The bucket index a prompt of `tokens` falls in (buckets not empty).
  size_t find(int64_t tokens) const;
  uint64_t members(size_t bucket) const { return buckets_[bucket].members; }
  const std::string& name(size_t bucket) const { return buckets_[bucket].name; }
  size_t size() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::string name;
    int64_t max_tokens;
    uint64_t members;
  };
  std::vector<Bucket> buckets_;
};

// Keeps the candidates of the bucket a prompt of `tokens` falls in; all of them when there are no
// buckets or none of that bucket's members is among them (better another bucket than a 503).
void keep_bucket(const Buckets& buckets, int64_t tokens, std::vector<Candidate>& candidates);

}  // namespace beluga::router
