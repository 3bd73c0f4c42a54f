#include "parallel/expert_parallel.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "util/error.h"

namespace beluga {

ExpertParallelMoe::ExpertParallelMoe(Ops& ops, Communicator& comm, const ExpertSharding& sharding)
    : ops_(ops), comm_(comm), sharding_(sharding) {
  BELUGA_CHECK(comm.size() == sharding.ranks(), "expert parallelism: a group of ", comm.size(),
               " ranks with a sharding over ", sharding.ranks());
}

namespace {

// An I32 tensor in scratch holding `v` (at least one element, so an empty list is a valid tensor).
Tensor upload_i32(Ops& ops, const std::vector<int32_t>& v, int64_t cols = 1) {
  const int64_t n = std::max<int64_t>(int64_t(v.size()) / cols, 1);
  Tensor t = ops.scratch(DType::kI32, {n, cols});
  if (!v.empty()) ops.copy_from_host(t.rows(0, int64_t(v.size()) / cols), v.data());
  return t;
}

Tensor upload_f32(Ops& ops, const std::vector<float>& v) {
  Tensor t = ops.scratch(DType::kF32, {std::max<int64_t>(int64_t(v.size()), 1), 1});
  if (!v.empty()) ops.copy_from_host(t.rows(0, int64_t(v.size())), v.data());
  return t;
}

}  // namespace

void ExpertParallelMoe::forward(Tensor out, const NormedInput& in, const ExpertParallelLayer& m) {
  const int64_t T = in.out.shape[0], K = m.params.top_k;
  Tensor d_ids = ops_.scratch(DType::kI32, {std::max<int64_t>(T, 1), K});
  Tensor d_w = ops_.scratch(DType::kF32, {std::max<int64_t>(T, 1), K});
  if (T > 0) ops_.norm_moe_gate(d_ids.rows(0, T), d_w.rows(0, T), in, m.router, m.bias, m.params);
  routed(out, in.out, d_ids.rows(0, T), d_w.rows(0, T), m);
}

void ExpertParallelMoe::forward_replicated(Tensor out, const NormedInput& in, const ExpertParallelLayer& m) {
  const int N = comm_.size(), me = comm_.rank();
  const int64_t T = in.out.shape[0], D = in.out.shape[1], K = m.params.top_k;
  if (T > 0) ops_.normalize(in);
  const int64_t a = T * me / N, b = T * (me + 1) / N, n = b - a;
  Tensor d_ids = ops_.scratch(DType::kI32, {std::max<int64_t>(n, 1), K});
  Tensor d_w = ops_.scratch(DType::kF32, {std::max<int64_t>(n, 1), K});
  const Tensor x = in.out.rows(a, b);
  if (n > 0) ops_.moe_gate(d_ids.rows(0, n), d_w.rows(0, n), x, m.router, m.bias, m.params);
  const DType act = ops_.act_dtype();
  Tensor mine = ops_.scratch(act, {std::max<int64_t>(n, 1), D});
  routed(mine.rows(0, n), x, d_ids.rows(0, n), d_w.rows(0, n), m);
  // Every rank gets every rank's rows: the same rows to each peer, rank p's rows from rank p.
  const size_t row_bytes = size_t(D) * dtype_size(act);
  std::vector<size_t> send(size_t(N), size_t(n) * row_bytes), recv(static_cast<size_t>(N));
  for (int p = 0; p < N; ++p) recv[size_t(p)] = size_t(T * (p + 1) / N - T * p / N) * row_bytes;
  // A send buffer of N copies of this rank's rows (all_to_all_v reads one block per peer).
  Tensor rep = ops_.scratch(act, {std::max<int64_t>(n * N, 1), D});
  for (int p = 0; p < N && n > 0; ++p) ops_.copy(rep.rows(n * p, n * (p + 1)), mine.rows(0, n));
  Tensor all = ops_.scratch(act, {std::max<int64_t>(T, 1), D});
  comm_.all_to_all_v(rep.data, send, all.data, recv);
  if (T > 0) ops_.copy(out, all.rows(0, T));
  for (int p = 0; p < N; ++p)
    if (p != me) traffic_.sent_bytes += send[size_t(p)];
}

void ExpertParallelMoe::routed(Tensor out, const Tensor& x, const Tensor& d_ids, const Tensor& d_w,
                               const ExpertParallelLayer& m) {
  const int N = comm_.size(), me = comm_.rank();
  const int64_t T = x.shape[0], D = x.shape[1], K = m.params.top_k;
  const ExpertSharding& sharding = m.sharding ? *m.sharding : sharding_;
  BELUGA_CHECK(sharding.ranks() == N, "expert parallelism: a layer sharded over ", sharding.ranks(),
               " ranks in a group of ", N);
  const int first_slot = sharding.slot_begin(me);
  BELUGA_CHECK(int(m.local_experts.size()) == sharding.slot_end(me) - first_slot, "expert parallelism: rank ",
               me, " holds ", m.local_experts.size(), " experts for ", sharding.slot_end(me) - first_slot,
               " slots");
  const DType act = ops_.act_dtype();

  // 1. This rank's tokens' routing (logical expert ids) on the host: the plan is made there.
  std::vector<int32_t> ids(size_t(T * K));
  std::vector<float> weights(size_t(T * K));
  if (T > 0) {
    ops_.copy_to_host(d_ids, ids.data());
    ops_.copy_to_host(d_w, weights.data());
    ops_.synchronize();
  }
  if (m.load) m.load->add_routing(m.load_layer, ids);

  // 2. The dispatch plan: entries (t, i) grouped by destination rank, in entry order within each.
  std::vector<int> dest(size_t(T * K)), slot(size_t(T * K));
  std::vector<size_t> send_rows(size_t(N), 0);
  for (int64_t e = 0; e < T * K; ++e) {
    const int s = sharding.route(ids[size_t(e)], e / K, me);
    slot[size_t(e)] = s;
    dest[size_t(e)] = sharding.owner(s);
    ++send_rows[size_t(dest[size_t(e)])];
  }
  std::vector<size_t> offset(size_t(N) + 1, 0);
  for (int p = 0; p < N; ++p) offset[size_t(p) + 1] = offset[size_t(p)] + send_rows[size_t(p)];
  const size_t S = offset[size_t(N)];
  std::vector<int32_t> pos(size_t(T * K));  // entry -> its row in the send order
  std::vector<int32_t> send_token(S), send_slot(S);
  std::vector<float> send_w(S);
  {
    std::vector<size_t> fill(offset.begin(), offset.end() - 1);
    for (int64_t e = 0; e < T * K; ++e) {
      const size_t r = fill[size_t(dest[size_t(e)])]++;
      pos[size_t(e)] = int32_t(r);
      send_token[r] = int32_t(e / K);
      send_slot[r] = slot[size_t(e)] - sharding.slot_begin(dest[size_t(e)]);  // the receiver's local index
      send_w[r] = weights[size_t(e)];
    }
  }

  // 3. Counts: rank p's row counts for every rank, so each rank knows what it receives.
  std::vector<uint64_t> my_counts(send_rows.begin(), send_rows.end()), all_counts(size_t(N * N));
  comm_.all_gather(my_counts.data(), all_counts.data(), size_t(N) * sizeof(uint64_t));
  std::vector<size_t> recv_rows(static_cast<size_t>(N));
  for (int p = 0; p < N; ++p) recv_rows[size_t(p)] = size_t(all_counts[size_t(p * N + me)]);
  const size_t R = std::accumulate(recv_rows.begin(), recv_rows.end(), size_t(0));

  auto scaled = [](const std::vector<size_t>& rows, size_t per_row) {
    std::vector<size_t> r(rows);
    for (size_t& n : r) n *= per_row;
    return r;
  };
  // 4. Dispatch: the token rows, their slot ids and their weights.
  Tensor x_send = ops_.scratch(act, {std::max<int64_t>(int64_t(S), 1), D});
  if (S > 0)
    ops_.gather_rows(x_send.rows(0, int64_t(S)), x, upload_i32(ops_, send_token).rows(0, int64_t(S)));
  Tensor slot_send = upload_i32(ops_, send_slot), w_send = upload_f32(ops_, send_w);
  Tensor x_recv = ops_.scratch(act, {std::max<int64_t>(int64_t(R), 1), D});
  Tensor slot_recv = ops_.scratch(DType::kI32, {std::max<int64_t>(int64_t(R), 1), 1});
  Tensor w_recv = ops_.scratch(DType::kF32, {std::max<int64_t>(int64_t(R), 1), 1});
  const size_t row_bytes = size_t(D) * dtype_size(act);
  comm_.all_to_all_v(x_send.data, scaled(send_rows, row_bytes), x_recv.data, scaled(recv_rows, row_bytes));
  comm_.all_to_all_v(slot_send.data, scaled(send_rows, 4), slot_recv.data, scaled(recv_rows, 4));
  comm_.all_to_all_v(w_send.data, scaled(send_rows, 4), w_recv.data, scaled(recv_rows, 4));

  // 5. This rank's experts on the received rows, each row weighted as its own token with k = 1.
  Tensor y = ops_.scratch(act, {std::max<int64_t>(int64_t(R), 1), D});
  if (R > 0)
    ops_.moe_experts(y.rows(0, int64_t(R)), x_recv.rows(0, int64_t(R)), slot_recv.rows(0, int64_t(R)),
                     w_recv.rows(0, int64_t(R)), m.local_experts, nullptr);

  // 6. Combine: the results go back in the order they came, i.e. this rank's send order.
  Tensor y_back = ops_.scratch(act, {std::max<int64_t>(int64_t(S), 1), D});
  comm_.all_to_all_v(y.data, scaled(recv_rows, row_bytes), y_back.data, scaled(send_rows, row_bytes));

  // 7. out[t] = sum over i in routing order of result (t, i), then + shared(x[t]).
  if (T > 0) {
    Tensor part = ops_.scratch(act, {T, D});
    for (int64_t i = 0; i < K; ++i) {
      std::vector<int32_t> rows(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) rows[size_t(t)] = pos[size_t(t * K + i)];
      Tensor idx = upload_i32(ops_, rows);
      if (i == 0) {
        ops_.gather_rows(out, y_back, idx);
      } else {
        ops_.gather_rows(part, y_back, idx);
        ops_.add(out, out, part);
      }
    }
    if (m.shared) {
      Tensor zeros = upload_i32(ops_, std::vector<int32_t>(size_t(T), 0));
      Tensor ones = upload_f32(ops_, std::vector<float>(size_t(T), 1.0f));
      ops_.moe_experts(part, x, zeros, ones, std::span<const ExpertWeights>(m.shared, 1), nullptr);
      ops_.add(out, out, part);
    }
  }

  const uint64_t row_total = uint64_t(row_bytes) + 8;  // a row, its slot id and weight
  for (int p = 0; p < N; ++p) {
    const uint64_t b =
        uint64_t(send_rows[size_t(p)]) * row_total + uint64_t(recv_rows[size_t(p)]) * row_bytes;
    (p == me ? traffic_.local_bytes : traffic_.sent_bytes) += b;
  }
  traffic_.dispatched_rows += uint64_t(T * K);
  traffic_.received_rows += uint64_t(R);
}

}  // namespace beluga
