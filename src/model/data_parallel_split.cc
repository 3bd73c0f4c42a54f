#include "model/data_parallel_split.h"

#include <algorithm>

#include "util/error.h"

namespace beluga {

void split_by_rank(const Batch& b, int blocks_per_rank, std::vector<RankPart>& parts) {
  BELUGA_CHECK(blocks_per_rank > 0 && !parts.empty(), "split_by_rank: no ranks to split over");
  const int ranks = int(parts.size());
  for (RankPart& p : parts) {
    p.batch.tokens.clear();
    p.batch.seqs.clear();
    p.batch.logit_rows.clear();
    p.logit_index.clear();
    p.token_rows.clear();
    p.source_rows.clear();
  }
  // Each sequence's rank, and where its rows start in the step and in its rank's part.
  std::vector<int> seq_rank(b.seqs.size()), seq_start(b.seqs.size() + 1, 0), local_start(b.seqs.size());
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const SeqChunk& c = b.seqs[s];
    BELUGA_CHECK(!c.block_table.empty(), "split_by_rank: sequence ", s, " has no cache blocks");
    const int r = c.block_table.front() / blocks_per_rank;
    BELUGA_CHECK(r >= 0 && r < ranks, "split_by_rank: block ", c.block_table.front(), " is past ", ranks,
                 " ranks of ", blocks_per_rank, " blocks");
    seq_rank[s] = r;
    seq_start[s + 1] = seq_start[s] + c.query_len;
    BELUGA_CHECK(c.query_len >= 0 && size_t(seq_start[s + 1]) <= b.tokens.size(),
                 "split_by_rank: the sequences hold more than the step's ", b.tokens.size(), " tokens");
    RankPart& p = parts[size_t(r)];
    SeqChunk local{c.context_len, c.query_len, {}};
    local.block_table.reserve(c.block_table.size());
    for (int blk : c.block_table) {
      BELUGA_CHECK(blk / blocks_per_rank == r, "split_by_rank: sequence ", s, " has blocks of ranks ", r,
                   " and ", blk / blocks_per_rank, " (a sequence's blocks must be one rank's)");
      local.block_table.push_back(blk - r * blocks_per_rank);
    }
    local_start[s] = int(p.batch.tokens.size());
    p.batch.tokens.insert(p.batch.tokens.end(), b.tokens.begin() + seq_start[s],
                          b.tokens.begin() + seq_start[s] + c.query_len);
    for (int t = 0; t < c.query_len; ++t) p.token_rows.push_back(seq_start[s] + t);
    p.batch.seqs.push_back(std::move(local));
  }
  BELUGA_CHECK(size_t(seq_start.back()) == b.tokens.size(), "split_by_rank: the sequences hold ",
               seq_start.back(), " tokens of the step's ", b.tokens.size());
  for (size_t i = 0; i < b.logit_rows.size(); ++i) {
    const int row = b.logit_rows[i];
    BELUGA_CHECK(row >= 0 && row < seq_start.back(), "split_by_rank: logit row ", row, " out of range");
    const size_t s =
        size_t(std::upper_bound(seq_start.begin(), seq_start.end(), row) - seq_start.begin()) - 1;
    RankPart& p = parts[size_t(seq_rank[s])];
    p.batch.logit_rows.push_back(local_start[s] + row - seq_start[s]);
    p.logit_index.push_back(int(i));
  }
}

}  // namespace beluga
