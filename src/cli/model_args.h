// The options every model-running subcommand shares (--model, --load-format, --threads, --dtype,
// --max-model-len, --device) and the model they load.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "cli/args.h"
#include "engine/block_manager.h"
#include "engine/thread_rank_peers.h"
#include "loader/weight_source.h"
#include "model/model.h"

namespace beluga::cli {

struct LoadedModel {
  // --expert-parallel-size N > 1 (CPU): the thread ranks' group and sharding; `model` is rank 0 and
  // `peers` the others (declared before `model`: the peers stop after it).
  std::unique_ptr<LocalGroup> ep_group;
  std::unique_ptr<ExpertSharding> ep_sharding;
  std::string dir;
  ModelConfig cfg;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<Ops> ops;
  CpuOps* cpu = nullptr;  // ops, when the backend is the CPU's (null on other devices)
  std::string device = "cpu";
  std::unique_ptr<ThreadRankPeers> ep_peers;
  std::vector<int> ep_devices;  // CUDA: each rank's GPU (rank 0's first); empty on the CPU
  std::unique_ptr<Model> model;
  // --eplb: the group's live placement (declared after the models: destroyed first, it waits for a
  // rebalance in flight, which may be loading through them).
  std::unique_ptr<LiveExpertPlacement> ep_live;
  double load_seconds = 0;
  std::string config_path;
  BlockHash weights_digest;  // the tensors the model loaded (kvstore/fingerprint.h)
};

// The built-in demo model, next to the binary's source tree (models/beluga-demo-coder-mtp).
std::string default_model_dir();

// The shared model options, read and checked (nothing is loaded): the model directory as the one
// positional argument (`beluga serve DIR`, as `vllm serve MODEL`) or --model DIR (or DIR/config.json;
// both given and different is an error; default: the built-in model), --load-format auto|dummy,
// --threads N, --dtype float32|bfloat16 (activation rounding for BF16 GEMMs), --max-model-len N,
// --device cpu|cuda (cuda: in builds with the CUDA backend; BF16 activations, dummy weights made
// on the GPU), --enforce-eager (no CUDA graphs for decode steps), --deterministic (batch-invariant
// kernels: CpuOptions / CudaOptions::deterministic; the engine's part is EngineConfig::deterministic).
struct ModelArgs {
  std::string dir, config_path;
  std::string load_format = "auto";
  std::string device = "cpu";
  CpuOptions cpu;
  int max_model_len = 0;
  bool enforce_eager = false;
  bool deterministic = false;  // also in `cpu`; the CUDA backend takes it at load
  // --expert-parallel-size N: the routed experts split over N thread ranks (CPU, DeepSeek V2/V3),
  // every rank stepping every batch; 1: one model holds all experts.
  int expert_parallel_size = 1;
  // --data-parallel-size N: the expert_parallel_size (= N) ranks are attention data parallel, each
  // stepping its own sequences (model/data_parallel_split.h), not the whole batch.
  bool data_parallel = false;
  // --tensor-parallel-size N: a dense model's heads and MLP split over N thread ranks
  // (model.h: TensorParallelism), every rank stepping every batch; not with expert parallelism.
  int tensor_parallel_size = 1;
  // --eplb (or any --eplb-* option), with expert_parallel_size > 1: live EPLB (parallel/live_placement.h)
  // with these knobs; unset: the contiguous layout, fixed, exactly as without it.
  std::optional<LiveEplbOptions> eplb;
  // Tests of failure handling (serve's BELUGA_TEST_FAIL_RANK=R:STEP): a thread rank that fails.
  InjectedRankFault ep_fault;
  // CUDA: the GPUs of ranks 1 .. N-1 (empty: rank r on GPU r modulo the GPUs present); rank 0 runs
  // on the backend's own device (0).
  std::vector<int> ep_peer_devices;
  // Loading progress on stderr: a bar when stderr is a terminal; plain lines otherwise only when set
  // (serve sets it: its stderr is a log), so commands whose output is parsed stay quiet.
  bool progress_lines = false;
};
ModelArgs parse_model_args(const Args& args);
// The thread ranks the model runs over (expert, data or tensor parallel; 1: one model).
inline int group_ranks(const ModelArgs& ma) {
  return ma.tensor_parallel_size > 1 ? ma.tensor_parallel_size : ma.expert_parallel_size;
}
// The attention form a command runs: `asked` (--mla-mode), or absorbed for every step under
// --deterministic (an expanded/absorbed choice by query length would depend on the batch).
MlaMode mla_mode_for(const ModelArgs& ma, MlaMode asked);
// Reads the config and loads the weights.
LoadedModel load_model_dir(const ModelArgs& ma);
// After a rank failed (cli/serving_engine.h): rank 0's model, the group, its sharding, live
// placement and peers are rebuilt over `ep_size` ranks of the same kind (expert or tensor parallel;
// 1: one model with every expert and head, no EPLB),
// ranks 1.. on `peer_devices` (CUDA; their first ep_size - 1); the backend, the weights (their
// source stays open) and the config stay.
void reload_expert_parallel(LoadedModel& m, const ModelArgs& ma, int ep_size, std::vector<int> peer_devices);
// parse_model_args, args.check_all_used(), load_model_dir: a command reads its own options first,
// so a bad command line fails before anything loads.
LoadedModel load_model_from_args(const Args& args);

}  // namespace beluga::cli
