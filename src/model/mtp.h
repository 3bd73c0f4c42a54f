// DeepSeek-V3's multi-token prediction (MTP) module, the draft model of speculative decoding.
// Row t of an MTP step takes the main model's final-normed hidden state h_i and the token x_{i+1}
// and predicts x_{i+2}: e = eh_proj([enorm(embed(x_{i+1})) | hnorm(h_i)]) (embedding first), one decoder
// layer (stored as model.layers.{num_hidden_layers}) at rope position i with its own paged KV cache,
// then shared_head.norm and the output head. Embedding and head are the main model's unless the
// checkpoint stores copies under the MTP layer (.embed_tokens, .shared_head.head, as DeepSeek-V3's do).
// Chaining (k > 1 drafts) feeds the module's own normed output back as the next row's h.
#pragma once

#include "backend/ops.h"

namespace beluga {

struct MtpWeights {
  int layer = 0;  // the decoder layer's index (num_hidden_layers)
  Tensor enorm, hnorm, head_norm;
  Weight eh_proj;  // [D, 2D]
  Tensor embed;    // empty: the main model's
  Weight head;     // empty: the main model's lm_head
};

}  // namespace beluga
