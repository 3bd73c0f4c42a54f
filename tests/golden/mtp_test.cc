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

// A proposal chain (the MTP step, then steps over its own output) gives the same drafts when each
// step reads the previous one's argmaxes on the device (ForwardOptions::device_ids, device_greedy:
// one read-back for the chain) and gathers its own h rows (hidden_rows; the third step reads the
// buffer it writes) as when they go through the host: two sequences, three steps.
TEST(DemoModelMtp, ChainedStepsReadTheirDraftsOnTheDevice) {
  Demo d;
  const int D = d.cfg.hidden_size, kSeqs = 2, kSteps = 3;
  std::vector<int> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back(100 + (i * 37) % 900);
  const int P = int(prompt.size());
  struct Drafts {
    std::vector<int32_t> ids;
    std::vector<float> probs;
  };
  auto chain = [&](bool on_device) {
    KvCache kv = d.model->make_kv_cache(4), mkv = d.model->make_mtp_kv_cache(4);
    Tensor hidden = d.ops.alloc_persistent(d.ops.act_dtype(), {kSeqs * P, D});
    Tensor in = d.ops.alloc_persistent(d.ops.act_dtype(), {kSeqs * P, D});
    Tensor out = d.ops.alloc_persistent(d.ops.act_dtype(), {kSeqs * P, D});
    Batch main;
    for (int s = 0; s < kSeqs; ++s) {  // sequence 1: the prompt reversed
      if (s == 0)
        main.tokens.insert(main.tokens.end(), prompt.begin(), prompt.end());
      else
        main.tokens.insert(main.tokens.end(), prompt.rbegin(), prompt.rend());
      main.seqs.push_back({0, P, {2 * s, 2 * s + 1}});
    }
    ForwardOptions fo;
    fo.final_hidden = &hidden;
    d.model->forward(main, kv, nullptr, fo);
    Tensor dev_ids = d.ops.alloc_persistent(DType::kI32, {kSteps * kSeqs});
    Tensor dev_probs = d.ops.alloc_persistent(DType::kF32, {kSteps * kSeqs});
    Drafts r{std::vector<int32_t>(size_t(kSteps * kSeqs)), std::vector<float>(size_t(kSteps * kSeqs))};
    Tensor prev;
    for (int j = 0; j < kSteps; ++j) {
      // Step 0: each sequence's last P - 1 rows (h_i, x_{i+1}), its proposal row the last; then one row
      // a sequence, h its previous output row, x the previous draft.
      Batch b;
      for (int s = 0; s < kSeqs; ++s) {
        if (j == 0) {
          b.tokens.insert(b.tokens.end(), main.tokens.begin() + s * P + 1, main.tokens.begin() + (s + 1) * P);
          b.seqs.push_back({0, P - 1, {2 * s, 2 * s + 1}});
          b.logit_rows.push_back((s + 1) * (P - 1) - 1);
        } else {
          b.tokens.push_back(on_device ? 0 : r.ids[size_t((j - 1) * kSeqs + s)]);
          b.seqs.push_back({P - 2 + j, 1, {2 * s, 2 * s + 1}});
          b.logit_rows.push_back(s);
        }
      }
      // Through the host, each step's h rows are copied into `in` first; on the device the step
      // gathers them (hidden_rows), the later steps reading `out`, which they also write, in place.
      std::vector<int32_t> rows;
      for (int s = 0; s < kSeqs; ++s)
        if (j == 0)
          for (int i = 0; i < P - 1; ++i) rows.push_back(s * P + i);
        else
          rows.push_back(j == 1 ? (s + 1) * (P - 1) - 1 : s);
      const Tensor& from = j == 0 ? hidden : out;
      ForwardOptions mo;
      mo.final_hidden = &out;
      if (on_device && j < 2) mo.hidden_rows = rows;
      if (!on_device)
        for (size_t t = 0; t < rows.size(); ++t)
          d.ops.copy(in.rows(int64_t(t), int64_t(t) + 1), from.rows(rows[t], rows[t] + 1));
      if (on_device) {
        mo.device_greedy = dev_ids.rows(j * kSeqs, (j + 1) * kSeqs);
        mo.device_greedy_probs = dev_probs.rows(j * kSeqs, (j + 1) * kSeqs);
        if (j > 0) {
          prev = dev_ids.rows((j - 1) * kSeqs, j * kSeqs);
          mo.device_ids = &prev;
        }
      } else {
        mo.greedy_tokens = r.ids.data() + j * kSeqs;
        mo.greedy_probs = r.probs.data() + j * kSeqs;
      }
      d.model->mtp_forward(b, on_device ? from : in, mkv, nullptr, mo);
    }
    if (on_device) {
      d.ops.copy_to_host(dev_ids, r.ids.data());
      d.ops.copy_to_host(dev_probs, r.probs.data());
    }
    return r;
  };
  const Drafts host = chain(false), device = chain(true);
  EXPECT_EQ(device.ids, host.ids);
  EXPECT_EQ(device.probs, host.probs);
  EXPECT_NE(host.ids[0], host.ids[1]) << "the two sequences propose different drafts (a real check)";
}

// The MTP layer is not part of the main model: its logits and parameter count are the same as a
// checkpoint without it would give (the golden test checks the logits; here, the count excludes it).
TEST(DemoModelMtp, ParametersExcludeTheModule) {
  Demo d;
  EXPECT_NEAR(double(d.model->num_parameters()) / 1e6, 14.4, 0.05);
}

}  // namespace
}  // namespace beluga
