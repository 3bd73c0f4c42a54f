#include "cli/bench_grammar_batch.h"

#include <algorithm>
#include <chrono>

#include "engine/mask_filler.h"
#include "grammar/grammar_processor.h"

namespace beluga::cli {

void time_batch_masks(const std::shared_ptr<const grammar::CompiledGrammar>& g,
                      const std::vector<std::vector<int>>& instances, int batch,
                      const std::vector<int>& threads, std::vector<std::vector<double>>& us) {
  if (instances.empty() || batch <= 0) return;
  const int vocab = int(g->vocab->size());
  const size_t words = g->vocab->mask_words();
  std::vector<std::unique_ptr<grammar::GrammarProcessor>> procs;
  for (int s = 0; s < batch; ++s) procs.push_back(std::make_unique<grammar::GrammarProcessor>(g));
  std::vector<uint32_t> masks(size_t(batch) * words);
  std::vector<MaskFiller::Job> jobs(static_cast<size_t>(batch));
  std::vector<std::unique_ptr<MaskFiller>> fillers;
  for (int t : threads) fillers.push_back(std::make_unique<MaskFiller>(t));
  size_t steps = 0;
  for (const auto& ids : instances) steps = std::max(steps, ids.size());
  for (size_t k = 0; k <= steps; ++k) {
    for (size_t i = 0; i < fillers.size(); ++i) {
      for (int s = 0; s < batch; ++s)
        jobs[size_t(s)] = {procs[size_t(s)].get(), masks.data() + size_t(s) * words, {}};
      const auto t0 = std::chrono::steady_clock::now();
      fillers[i]->fill(jobs, vocab);
      us[i].push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    for (int s = 0; s < batch; ++s) {
      const auto& ids = instances[size_t(s) % instances.size()];
      if (k < ids.size()) procs[size_t(s)]->accept(ids[k]);  // the instance was checked token by token
    }
  }
}

}  // namespace beluga::cli
