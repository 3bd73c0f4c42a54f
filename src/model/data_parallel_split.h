// Attention data parallelism over an expert-parallel group of thread ranks: the engine's paged KV
// blocks split into equal ranges, rank r's cache holding blocks [r P, (r + 1) P) (P per rank), and a
// sequence's blocks all in one range (BlockManager's partitions). Each rank steps only the sequences
// whose blocks it holds, attention and all, with block ids local to its cache; the MoE layers
// exchange tokens across the group (ExpertParallelMoe::forward). A rank with no sequence in a step
// still takes part in every exchange (Model::idle_step).
#pragma once

#include <cstdint>
#include <vector>

#include "model/batch.h"

namespace beluga {

// One rank's share of a step.
struct RankPart {
  Batch batch;                   // its sequences in the step's order, block ids local to its cache
  std::vector<int> logit_index;  // logit row i of `batch` is logit row logit_index[i] of the step
  std::vector<int> token_rows;   // token row t of `batch` is token row token_rows[t] of the step
  // MTP steps (StepPeers::begin_mtp_parts): token row t's input row in the rank's own hidden states.
  std::vector<int32_t> source_rows;
};

// Splits `b` over parts.size() ranks of `blocks_per_rank` blocks each (parts are reused: their
// vectors keep their capacity). Throws when a sequence's blocks span two ranks.
void split_by_rank(const Batch& b, int blocks_per_rank, std::vector<RankPart>& parts);

// Where every rank writes the logit rows of its part, at their rows in the step (host memory, each
// row written by one rank): logits [rows, vocab], or, for greedy steps, each row's argmax id and its
// probability (either may be null).
struct PartOutputs {
  float* logits = nullptr;
  int32_t* greedy_tokens = nullptr;
  float* greedy_probs = nullptr;
};

}  // namespace beluga
