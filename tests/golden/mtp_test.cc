// The demo model's MTP module against the logits Hugging Face transformers-style float32 code
// computed from the stored bf16 weights (reference.safetensors: mtp_logits_k at positions mtp_pos_k,
// row i taking the main model's final-normed h_i and the prompt token x_{i+1}). Bound: per-row
// relative L2 error <= 1e-4, as for the main model's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "backend/cpu/cpu_ops.h"
#include "golden_test_support.h"
#include "loader/safetensors.h"
#include "loader/weight_source.h"
#include "model/model.h"

namespace beluga {
namespace {

using testing::ints;
using testing::rel_l2;

const std::string kDir = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";

struct Demo {
  ModelConfig cfg = ModelConfig::from_file(kDir + "/config.json");
  Checkpoint ckpt{kDir};
  CpuOps ops;
  std::unique_ptr<Model> model = load_model(cfg, ckpt, ops, 1024);
  SafetensorsFile ref{kDir + "/reference.safetensors"};
};

// Main forward over the prompt keeping every row's final hidden state, then one MTP step over rows
// (h_i, x_{i+1}) for i = 0..P-2. `split` > 0 runs the MTP rows in two steps (a prefix, then the rest),
// which must give the same logits: its KV cache carries the context.
std::vector<float> mtp_logits(Demo& d, const std::vector<int>& prompt, const std::vector<int64_t>& pos,
                              int split) {
  const int P = int(prompt.size()), V = d.cfg.vocab_size;
  KvCache kv = d.model->make_kv_cache(4), mkv = d.model->make_mtp_kv_cache(4);
  Tensor hidden = d.ops.alloc_persistent(d.ops.act_dtype(), {P, d.cfg.hidden_size});
  Batch main;
  main.tokens = prompt;
  main.seqs.push_back({0, P, {1}});
  ForwardOptions opt;
  opt.final_hidden = &hidden;
  d.model->forward(main, kv, nullptr, opt);

  std::vector<float> out(pos.size() * size_t(V));
  auto run = [&](int from, int to, const Tensor& h) {
    Batch b;
    b.tokens.assign(prompt.begin() + from + 1, prompt.begin() + to + 1);
    b.seqs.push_back({from, to - from, {1}});
    std::vector<size_t> which;
    for (size_t r = 0; r < pos.size(); ++r)
      if (pos[r] >= from && pos[r] < to) {
        b.logit_rows.push_back(int(pos[r]) - from);
        which.push_back(r);
      }
    std::vector<float> lg(b.logit_rows.size() * size_t(V));
    d.model->mtp_forward(b, h, mkv, lg.data());
    for (size_t k = 0; k < which.size(); ++k)
      std::copy_n(lg.data() + k * size_t(V), V, out.data() + which[k] * size_t(V));
  };
  if (split > 0) {
    run(0, split, hidden);
    run(split, P - 1, hidden.rows(split, P));
  } else {
    run(0, P - 1, hidden);
  }
  return out;
}

TEST(DemoModelMtp, LogitsMatchReference) {
  Demo d;
  ASSERT_TRUE(d.model->has_mtp());
  const int V = d.cfg.vocab_size;
  for (int k = 0; k < 2; ++k) {
    const std::string s = std::to_string(k);
    auto p64 = ints(d.ref, "prompt_" + s);
    const std::vector<int> prompt(p64.begin(), p64.end());
    const auto pos = ints(d.ref, "mtp_pos_" + s);
    const float* ref = static_cast<const float*>(d.ref.get("mtp_logits_" + s).data);
    for (int split : {0, int(pos[1])}) {
      const std::vector<float> ours = mtp_logits(d, prompt, pos, split);
      for (size_t r = 0; r < pos.size(); ++r)
        EXPECT_LE(rel_l2(ours.data() + r * size_t(V), ref + r * size_t(V), V), 1e-4)
            << "prompt " << k << " position " << pos[r] << " split " << split;
    }
  }
}

// The MTP layer is not part of the main model: its logits and parameter count are the same as a
// checkpoint without it would give (the golden test checks the logits; here, the count excludes it).
TEST(DemoModelMtp, ParametersExcludeTheModule) {
  Demo d;
  EXPECT_NEAR(double(d.model->num_parameters()) / 1e6, 14.4, 0.05);
}

}  // namespace
}  // namespace beluga
