// The grammar as the engine's LogitsProcessor (engine/logits_processor.h): one Matcher per sequence
// over a shared compiled grammar. The engine's vocabulary may be larger than the tokenizer's (padded
// logit rows): those ids are never allowed.
#pragma once

#include <memory>

#include "engine/logits_processor.h"
#include "grammar/matcher.h"

namespace beluga::grammar {

class GrammarProcessor : public LogitsProcessor {
 public:
  explicit GrammarProcessor(std::shared_ptr<const CompiledGrammar> g) : m_(std::move(g)) {}
  void fill_mask(uint32_t* bitmask, int vocab) override;
  void accept(int token) override;  // throws beluga::Error for a token the mask did not allow
  void rollback(int n) override { m_.rollback(n); }
  bool is_accepting() const override { return m_.is_accepting(); }

 private:
  Matcher m_;
};

// A factory for EngineRequest::logits_processor.
LogitsProcessorFactory processor_factory(std::shared_ptr<const CompiledGrammar> g);

}  // namespace beluga::grammar
