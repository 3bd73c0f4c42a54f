#include "parallel/shard.h"

#include <algorithm>

#include "util/error.h"

namespace beluga {

ExpertSharding::ExpertSharding(int num_logical, int ranks, std::vector<int> physical_to_logical,
                               ReplicaChoice choice)
    : num_logical_(num_logical), ranks_(ranks), choice_(choice), p2l_(std::move(physical_to_logical)) {
  BELUGA_CHECK(ranks >= 1, "expert sharding: ranks must be at least 1, got ", ranks);
  BELUGA_CHECK(int(p2l_.size()) >= ranks, "expert sharding: ", p2l_.size(), " expert slots for ", ranks,
               " ranks (each rank needs one)");
  replicas_.resize(size_t(num_logical));
  for (int p = 0; p < int(p2l_.size()); ++p) {
    const int e = p2l_[size_t(p)];
    BELUGA_CHECK(e >= 0 && e < num_logical, "expert sharding: slot ", p, " maps to expert ", e,
                 ", not in [0, ", num_logical, ")");
    replicas_[size_t(e)].push_back(p);
  }
  for (int e = 0; e < num_logical; ++e)
    BELUGA_CHECK(!replicas_[size_t(e)].empty(), "expert sharding: expert ", e, " has no slot");
}

ExpertSharding ExpertSharding::contiguous(int num_experts, int ranks) {
  std::vector<int> identity(size_t(std::max(num_experts, 0)));
  for (int e = 0; e < num_experts; ++e) identity[size_t(e)] = e;
  return ExpertSharding(num_experts, ranks, std::move(identity));
}

int ExpertSharding::slot_begin(int rank) const {
  const int P = num_physical(), base = P / ranks_, extra = P % ranks_;
  return rank * base + std::min(rank, extra);
}

int ExpertSharding::slot_end(int rank) const {
  return slot_begin(rank + 1);
}

int ExpertSharding::owner(int physical) const {
  BELUGA_ASSERT(physical >= 0 && physical < num_physical());
  int r = 0;
  while (physical >= slot_end(r)) ++r;
  return r;
}

std::vector<int> ExpertSharding::local_experts(int rank) const {
  return {p2l_.begin() + slot_begin(rank), p2l_.begin() + slot_end(rank)};
}

int ExpertSharding::route(int e, int64_t token, int from) const {
  const std::vector<int>& r = replicas_[size_t(e)];
  if (choice_ == ReplicaChoice::kPreferLocal)
    for (int p : r)
      if (p >= slot_begin(from) && p < slot_end(from)) return p;
  return r[size_t(token % int64_t(r.size()))];
}

namespace {

// The decimal number at s[i..] followed by '.', or -1.
int number_at(const std::string& s, size_t i) {
  size_t j = i;
  while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
  if (j == i || j >= s.size() || s[j] != '.' || j - i > 9) return -1;
  return std::stoi(s.substr(i, j - i));
}

}  // namespace

std::optional<ExpertTensorName> parse_expert_tensor(const std::string& name) {
  static const std::string kExperts = ".experts.", kLayers = "layers.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return std::nullopt;
  ExpertTensorName r;
  r.expert = number_at(name, at + kExperts.size());
  if (r.expert < 0) return std::nullopt;
  if (const size_t l = name.find(kLayers); l != std::string::npos && l < at)
    r.layer = number_at(name, l + kLayers.size());
  return r;
}

bool rank_needs_tensor(const ExpertSharding& s, int rank, const std::string& name) {
  const auto t = parse_expert_tensor(name);
  if (!t) return true;
  if (t->expert >= s.num_logical()) return false;  // not an expert any slot holds
  for (int p = s.slot_begin(rank); p < s.slot_end(rank); ++p)
    if (s.logical(p) == t->expert) return true;
  return false;
}

}  // namespace beluga
