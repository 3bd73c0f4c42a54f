#include "parallel/eplb.h"

#include <algorithm>
#include <numeric>

#include "util/error.h"

namespace beluga::parallel {

namespace {

// After the greedy pass: a pack holding two items of one key swaps one of them with an item of another
// pack, of a key the first pack lacks, when the second pack lacks the first key and neither pack then
// weighs more than the heaviest pack did. The maximum never rises; co-located replicas (wasted slots,
// since both replicas on one GPU take all of the expert's tokens there) become distinct GPUs.
void spread_repair(std::span<const double> w, std::span<const int> keys, int per_pack, Packing& out,
                   std::vector<double>& pack_load) {
  const int n = int(w.size()), packs = n / per_pack;
  std::vector<int> member(static_cast<size_t>(n));  // pack p's items at [p * per_pack, ...), by rank
  for (int i = 0; i < n; ++i)
    member[size_t(out.pack[size_t(i)] * per_pack + out.rank_in_pack[size_t(i)])] = i;
  const double limit = *std::max_element(pack_load.begin(), pack_load.end());
  auto count_key = [&](int p, int key, int except) {
    int c = 0;
    for (int r = 0; r < per_pack; ++r) {
      const int it = member[size_t(p * per_pack + r)];
      c += it != except && keys[size_t(it)] == key;
    }
    return c;
  };
  for (int a = 0; a < packs; ++a)
    for (int ra = 0; ra < per_pack; ++ra) {
      const int i = member[size_t(a * per_pack + ra)];
      if (count_key(a, keys[size_t(i)], i) == 0) continue;  // not co-located
      int best_b = -1, best_rb = -1;
      double best_cost = 0;
      for (int b = 0; b < packs; ++b) {
        if (b == a || count_key(b, keys[size_t(i)], -1) > 0) continue;
        for (int rb = 0; rb < per_pack; ++rb) {
          const int y = member[size_t(b * per_pack + rb)];
          if (count_key(a, keys[size_t(y)], i) > 0 || count_key(b, keys[size_t(y)], y) > 0) continue;
          const double la = pack_load[size_t(a)] - w[size_t(i)] + w[size_t(y)];
          const double lb = pack_load[size_t(b)] - w[size_t(y)] + w[size_t(i)];
          const double cost = std::max(la, lb);
          if (cost <= limit && (best_b < 0 || cost < best_cost)) best_b = b, best_rb = rb, best_cost = cost;
        }
      }
      if (best_b < 0) continue;
      const int y = member[size_t(best_b * per_pack + best_rb)];
      pack_load[size_t(a)] += w[size_t(y)] - w[size_t(i)];
      pack_load[size_t(best_b)] += w[size_t(i)] - w[size_t(y)];
      member[size_t(a * per_pack + ra)] = y;
      member[size_t(best_b * per_pack + best_rb)] = i;
      out.pack[size_t(y)] = a, out.rank_in_pack[size_t(y)] = ra;
      out.pack[size_t(i)] = best_b, out.rank_in_pack[size_t(i)] = best_rb;
    }
}

}  // namespace

Packing balanced_packing(std::span<const double> weights, int num_packs, std::span<const int> keys) {
  const int n = int(weights.size());
  BELUGA_CHECK(num_packs >= 1 && n % num_packs == 0, "eplb: ", n, " items do not pack evenly into ",
               num_packs, " packs");
  BELUGA_ASSERT(keys.empty() || int(keys.size()) == n);
  const int per_pack = n / num_packs;
  Packing out{std::vector<int>(size_t(n)), std::vector<int>(size_t(n))};
  if (per_pack == 1) {  // one item each: the identity, as in the published code
    std::iota(out.pack.begin(), out.pack.end(), 0);
    std::fill(out.rank_in_pack.begin(), out.rank_in_pack.end(), 0);
    return out;
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return weights[size_t(a)] > weights[size_t(b)]; });
  std::vector<double> pack_load(static_cast<size_t>(num_packs), 0.0);
  std::vector<int> pack_items(static_cast<size_t>(num_packs), 0);
  // The keys each pack holds so far (packs are small: the slots of one GPU).
  std::vector<int> pack_keys(keys.empty() ? 0 : size_t(n));
  for (int item : order) {
    const double w = weights[size_t(item)];
    auto holds_key = [&](int p) {
      const int* k = pack_keys.data() + size_t(p) * size_t(per_pack);
      return std::find(k, k + pack_items[size_t(p)], keys[size_t(item)]) != k + pack_items[size_t(p)];
    };
    int best = -1, best_free = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (pack_items[size_t(p)] >= per_pack) continue;
      if (best < 0 || pack_load[size_t(p)] < pack_load[size_t(best)]) best = p;
    }
    if (!keys.empty() && holds_key(best)) {
      for (int p = 0; p < num_packs; ++p) {
        if (pack_items[size_t(p)] >= per_pack || holds_key(p)) continue;
        if (best_free < 0 || pack_load[size_t(p)] < pack_load[size_t(best_free)]) best_free = p;
      }
      if (best_free >= 0) best = best_free;
    }
    out.pack[size_t(item)] = best;
    if (!keys.empty())
      pack_keys[size_t(best) * size_t(per_pack) + size_t(pack_items[size_t(best)])] = keys[size_t(item)];
    out.rank_in_pack[size_t(item)] = pack_items[size_t(best)]++;
    pack_load[size_t(best)] += w;
  }
  if (!keys.empty()) spread_repair(weights, keys, per_pack, out, pack_load);
  return out;
}

Replication replicate_experts(std::span<const double> weights, int num_phy) {
  const int n = int(weights.size());
  BELUGA_CHECK(num_phy >= n, "eplb: ", num_phy, " slots cannot hold ", n, " experts");
  Replication r{std::vector<int>(size_t(num_phy)), std::vector<int>(size_t(num_phy), 0),
                std::vector<int>(size_t(n), 1)};
  std::iota(r.phy_to_log.begin(), r.phy_to_log.begin() + n, 0);
  for (int slot = n; slot < num_phy; ++slot) {
    int best = 0;  // the first expert with the highest load per replica
    for (int e = 1; e < n; ++e)
      if (weights[size_t(e)] / r.count[size_t(e)] > weights[size_t(best)] / r.count[size_t(best)]) best = e;
    r.phy_to_log[size_t(slot)] = best;
    r.rank[size_t(slot)] = r.count[size_t(best)]++;
  }
  return r;
}

namespace {

// One layer, hierarchically: groups -> nodes, replicas within each node, replicas -> the node's GPUs.
LayerPlan plan_layer(std::span<const double> load, int num_replicas, int groups, int nodes, int gpus,
                     bool spread) {
  const int experts = int(load.size());
  const int group_size = experts / groups, groups_per_node = groups / nodes;
  const int experts_per_node = experts / nodes, slots_per_node = num_replicas / nodes;
  const int gpus_per_node = gpus / nodes, slots_per_gpu = num_replicas / gpus;

  // 1. Groups onto nodes. A node's experts get consecutive "node-local" indices: node n holds
  //    local_to_log[n * experts_per_node ...], its groups in packing order, each group's experts in order.
  std::vector<double> group_load(static_cast<size_t>(groups), 0.0);
  for (int e = 0; e < experts; ++e) group_load[size_t(e / group_size)] += load[size_t(e)];
  const Packing gp = balanced_packing(group_load, nodes);
  std::vector<int> local_to_log(static_cast<size_t>(experts));
  for (int g = 0; g < groups; ++g) {
    const int base = (gp.pack[size_t(g)] * groups_per_node + gp.rank_in_pack[size_t(g)]) * group_size;
    for (int i = 0; i < group_size; ++i) local_to_log[size_t(base + i)] = g * group_size + i;
  }

  LayerPlan plan;
  plan.phy_to_log.assign(size_t(num_replicas), -1);
  plan.replica_count.assign(size_t(experts), 0);
  plan.log_to_phy.assign(size_t(experts), {});
  std::vector<int> slot_rank(static_cast<size_t>(num_replicas), 0);
  std::vector<double> node_load(static_cast<size_t>(experts_per_node)),
      replica_load(static_cast<size_t>(slots_per_node));
  for (int n = 0; n < nodes; ++n) {
    const int* logs = local_to_log.data() + size_t(n) * size_t(experts_per_node);
    for (int j = 0; j < experts_per_node; ++j) node_load[size_t(j)] = load[size_t(logs[j])];
    // 2. Replicas within the node.
    const Replication rep = replicate_experts(node_load, slots_per_node);
    for (int k = 0; k < slots_per_node; ++k)
      replica_load[size_t(k)] =
          node_load[size_t(rep.phy_to_log[size_t(k)])] / rep.count[size_t(rep.phy_to_log[size_t(k)])];
    // 3. The node's replicas onto its GPUs.
    const Packing rp = balanced_packing(
        replica_load, gpus_per_node, spread ? std::span<const int>(rep.phy_to_log) : std::span<const int>());
    for (int k = 0; k < slots_per_node; ++k) {
      const int slot = n * slots_per_node + rp.pack[size_t(k)] * slots_per_gpu + rp.rank_in_pack[size_t(k)];
      const int log = logs[rep.phy_to_log[size_t(k)]];
      plan.phy_to_log[size_t(slot)] = log;
      slot_rank[size_t(slot)] = rep.rank[size_t(k)];
    }
    for (int j = 0; j < experts_per_node; ++j) plan.replica_count[size_t(logs[j])] = rep.count[size_t(j)];
  }
  for (int e = 0; e < experts; ++e)
    plan.log_to_phy[size_t(e)].assign(size_t(plan.replica_count[size_t(e)]), -1);
  for (int p = 0; p < num_replicas; ++p)
    plan.log_to_phy[size_t(plan.phy_to_log[size_t(p)])][size_t(slot_rank[size_t(p)])] = p;
  return plan;
}

}  // namespace

EplbPlan rebalance_experts(const std::vector<std::vector<double>>& loads, const EplbShape& s,
                           const EplbOptions& options) {
  BELUGA_CHECK(!loads.empty() && !loads[0].empty(), "eplb: no layers or no experts");
  const int experts = int(loads[0].size());
  BELUGA_CHECK(s.num_gpus >= 1 && s.num_nodes >= 1 && s.num_gpus % s.num_nodes == 0, "eplb: ", s.num_nodes,
               " nodes do not divide ", s.num_gpus, " GPUs");
  BELUGA_CHECK(s.num_replicas >= experts && s.num_replicas % s.num_gpus == 0, "eplb: ", s.num_replicas,
               " slots must hold the ", experts, " experts and divide evenly over ", s.num_gpus, " GPUs");
  BELUGA_CHECK(s.num_groups >= 1 && experts % s.num_groups == 0, "eplb: ", s.num_groups,
               " groups do not divide ", experts, " experts");
  bool hierarchical = s.num_groups % s.num_nodes == 0;
  if (options.policy == EplbPolicy::hierarchical) {
    BELUGA_CHECK(hierarchical, "eplb: the hierarchical policy needs the nodes (", s.num_nodes,
                 ") to divide the groups (", s.num_groups, ")");
  } else if (options.policy == EplbPolicy::global) {
    hierarchical = false;
  }
  if (hierarchical)
    BELUGA_CHECK(s.num_replicas % s.num_nodes == 0, "eplb: ", s.num_replicas, " slots do not split over ",
                 s.num_nodes, " nodes");
  EplbPlan plan;
  plan.hierarchical = hierarchical;
  for (const auto& layer : loads) {
    BELUGA_CHECK(int(layer.size()) == experts, "eplb: layers with different expert counts");
    for (double w : layer) BELUGA_CHECK(w >= 0, "eplb: negative load");
    plan.layers.push_back(hierarchical
                              ? plan_layer(layer, s.num_replicas, s.num_groups, s.num_nodes, s.num_gpus,
                                           options.spread_replicas)
                              : plan_layer(layer, s.num_replicas, 1, 1, s.num_gpus, options.spread_replicas));
  }
  return plan;
}

std::vector<double> gpu_loads(const LayerPlan& plan, std::span<const double> load, int num_gpus) {
  const int slots = int(plan.phy_to_log.size());
  BELUGA_CHECK(num_gpus >= 1 && slots % num_gpus == 0, "eplb: slots do not divide over the GPUs");
  std::vector<double> out(static_cast<size_t>(num_gpus), 0.0);
  for (int p = 0; p < slots; ++p) {
    const int e = plan.phy_to_log[size_t(p)];
    out[size_t(p / (slots / num_gpus))] += load[size_t(e)] / plan.replica_count[size_t(e)];
  }
  return out;
}

double max_over_mean(std::span<const double> per_gpu) {
  double sum = 0, mx = 0;
  for (double x : per_gpu) sum += x, mx = std::max(mx, x);
  return sum > 0 ? mx / (sum / double(per_gpu.size())) : 1.0;
}

}  // namespace beluga::parallel
