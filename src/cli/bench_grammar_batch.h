// `bench grammar --batch B`: a decode step's host mask time at batch B. B sequences, each walking one
// of a grammar's instances (sequence s takes instance s mod n; one that reaches its end stays in its
// final state), step in lockstep; at every step the B masks are filled by engine/mask_filler.h with
// each worker count of `threads`, timed as one fill per step (the same states for every count).
#pragma once

#include <memory>
#include <vector>

#include "grammar/compiled.h"

namespace beluga::cli {

// For each entry of `threads`, one duration in microseconds per step, appended to `us[i]`.
void time_batch_masks(const std::shared_ptr<const grammar::CompiledGrammar>& g,
                      const std::vector<std::vector<int>>& instances, int batch,
                      const std::vector<int>& threads, std::vector<std::vector<double>>& us);

}  // namespace beluga::cli
