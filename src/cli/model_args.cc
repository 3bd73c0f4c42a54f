#include "cli/model_args.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "engine/host_sample_rows.h"
#include "kvstore/fingerprint.h"
#include "loader/id_tables_from.h"
#include "loader/progress_source.h"
#include "util/error.h"
#include "util/log.h"
#include "util/progress.h"
#ifdef BELUGA_WITH_CUDA
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sample_rows.h"
#endif
#include "util/file.h"

namespace beluga::cli {

std::string default_model_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string exe = n > 0 ? std::string(buf, size_t(n)) : std::string("./beluga");
  std::string dir = exe.substr(0, exe.rfind('/'));
  for (const char* rel : {"/../models/beluga-demo-coder-mtp", "/models/beluga-demo-coder-mtp",
                          "/../../models/beluga-demo-coder-mtp"}) {
    if (file_exists(dir + rel + "/config.json")) return dir + rel;
  }
  fail("the built-in model was not found next to ", exe,
       " (expected ../models/beluga-demo-coder-mtp); pass --model DIR");
}

ModelArgs parse_model_args(const Args& args) {
  ModelArgs ma;
  std::string path = args.get_or("model", "");
  const auto& pos = args.positional();
  BELUGA_CHECK(pos.size() <= 1, "one model directory expected, got '", pos.size() > 1 ? pos[1] : "", "' too");
  if (!pos.empty()) {
    BELUGA_CHECK(path.empty() || path == pos[0], "the model is given twice and differently: '", pos[0],
                 "' and --model '", path, "'");
    path = pos[0];
  }
  if (path.empty()) path = default_model_dir();
  const std::string suffix = "config.json";
  ma.config_path = path + "/config.json";
  if (path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    ma.config_path = path;
    path = path.rfind('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  }
  ma.dir = path;
  ma.load_format = args.get_or("load-format", "auto");
  BELUGA_CHECK(ma.load_format == "auto" || ma.load_format == "dummy" || ma.load_format == "safetensors",
               "--load-format must be auto, safetensors or dummy");
  const std::string dtype = args.get_or("dtype", "float32");
  BELUGA_CHECK(dtype == "float32" || dtype == "bfloat16", "--dtype must be float32 or bfloat16");
  ma.cpu.threads = int(args.get_int("threads", 0));
  BELUGA_CHECK(ma.cpu.threads >= 0, "--threads must be >= 0");
  ma.cpu.bf16_activations = dtype == "bfloat16";
  ma.device = args.get_or("device", "cpu");
#ifdef BELUGA_WITH_CUDA
  BELUGA_CHECK(ma.device == "cpu" || ma.device == "cuda", "--device must be cpu or cuda");
#else
  BELUGA_CHECK(ma.device == "cpu", "--device ", ma.device, " is not available in this build (cpu only)");
#endif
  ma.max_model_len = int(args.get_int("max-model-len", 0));
  BELUGA_CHECK(ma.max_model_len >= 0, "--max-model-len must be >= 0");
  ma.enforce_eager = args.has("enforce-eager");
  ma.deterministic = ma.cpu.deterministic = args.has("deterministic");
  ma.expert_parallel_size = int(args.get_int("expert-parallel-size", 1));
  BELUGA_CHECK(ma.expert_parallel_size >= 1, "--expert-parallel-size must be >= 1");
  if (const int dp = int(args.get_int("data-parallel-size", 1)); dp != 1) {
    BELUGA_CHECK(dp > 1, "--data-parallel-size must be >= 1");
    BELUGA_CHECK(!args.has("expert-parallel-size") || ma.expert_parallel_size == dp, "--data-parallel-size ",
                 dp, " splits the experts over the same ", dp, " ranks: --expert-parallel-size must be ", dp,
                 " or left out");
    ma.expert_parallel_size = dp;
    ma.data_parallel = true;
  }
  ma.tensor_parallel_size = int(args.get_int("tensor-parallel-size", 1));
  BELUGA_CHECK(ma.tensor_parallel_size >= 1, "--tensor-parallel-size must be >= 1");
  BELUGA_CHECK(ma.tensor_parallel_size == 1 || ma.expert_parallel_size == 1,
               "--tensor-parallel-size, or --expert-parallel-size / --data-parallel-size: one or the other "
               "(tensor parallelism splits a DeepSeek model's experts over its own ranks)");
  if (args.has("eplb") || args.has("eplb-redundant-experts") || args.has("eplb-interval") ||
      args.has("eplb-window")) {
    LiveEplbOptions o;
    o.redundant_per_rank = int(args.get_int("eplb-redundant-experts", 0));
    o.interval_steps = int(args.get_int("eplb-interval", 1000));
    o.window_steps = int(args.get_int("eplb-window", 1000));
    BELUGA_CHECK(o.redundant_per_rank >= 0 && o.interval_steps >= 0 && o.window_steps >= 1,
                 "--eplb-redundant-experts and --eplb-interval must be >= 0, --eplb-window >= 1");
    BELUGA_CHECK(ma.expert_parallel_size > 1, "--eplb balances the ranks of --expert-parallel-size N > 1");
    // On GPUs a rebalance uploads the moved experts from the checkpoint on its preparing thread (each
    // into memory of its own); the GPU's dummy weights are made by rank 0's backend, which that thread
    // must not drive while the ranks step.
    BELUGA_CHECK(ma.device == "cpu" || ma.load_format != "dummy",
                 "--eplb on CUDA loads moved experts from a checkpoint: not with --load-format dummy");
    ma.eplb = o;
  }
  return ma;
}

namespace {

// The thread ranks 1 .. n-1's backends: on the CPU each a CpuOps of its own; on CUDA rank r on
// device r (modulo the devices present: ranks sharing a GPU are for tests), or on ma's
// ep_peer_devices. `transport` gets how the group's buffers move (device copies on CUDA).
std::vector<std::unique_ptr<Ops>> peer_backends(LoadedModel& m, const ModelArgs& ma, int n,
                                                LocalTransport& transport) {
  if (ma.device == "cpu") return cpu_peer_ops(n, ma.cpu);
  std::vector<std::unique_ptr<Ops>> peer_ops;
#ifdef BELUGA_WITH_CUDA
  const int devices = CudaOps::device_count();
  if (devices < n)
    log::warn("model", n, " thread ranks over ", devices, devices == 1 ? " GPU" : " GPUs",
              ": ranks share GPUs (no speed-up; for tests)");
  transport.copy = &CudaOps::copy_between;
  transport.ready.push_back([ops = m.ops.get()] { ops->synchronize(); });
  m.ep_devices = {static_cast<CudaOps&>(*m.ops).device_index()};
  for (int r = 1; r < n; ++r) {
    CudaOptions co;
    co.device = size_t(r - 1) < ma.ep_peer_devices.size() ? ma.ep_peer_devices[size_t(r - 1)] : r % devices;
    m.ep_devices.push_back(co.device);
    co.deterministic = ma.deterministic;
    peer_ops.push_back(std::make_unique<CudaOps>(co));
    transport.ready.push_back([ops = peer_ops.back().get()] { ops->synchronize(); });
  }
  m.ops->bind_thread();  // rank 0 loads next
#endif
  return peer_ops;
}

// Rank 0's model through `src` and, with `ranks` > 1, the thread ranks' group and peers: expert
// parallel (with its sharding and live placement) or, with ma.tensor_parallel_size > 1, tensor
// parallel; the sampler and the eager flag as asked.
void load_ranks(LoadedModel& m, const ModelArgs& ma, int ranks, WeightSource& src, InjectedRankFault fault) {
  const int n = ranks;
  const bool tensor = ma.tensor_parallel_size > 1;
  if (n > 1 && tensor) {
    LocalTransport transport;
    std::vector<std::unique_ptr<Ops>> peer_ops = peer_backends(m, ma, n, transport);
    m.ep_group = std::make_unique<LocalGroup>(n, std::move(transport));
    // A DeepSeek model's routed experts split over the same ranks (each steps every token), its
    // latent cache is every rank's; a dense model's ranks cache their own KV heads.
    const bool mla = m.cfg.is_mla();
    if (mla)
      m.ep_sharding = std::make_unique<ExpertSharding>(ExpertSharding::contiguous(m.cfg.n_routed_experts, n));
    const int max_positions = ma.max_model_len;
    auto load = [&](int r, Ops& ops, WeightSource& from) {
      Communicator* comm = &m.ep_group->communicator(r);
      const TensorParallelism tp{comm};
      const ExpertParallelism ep{comm, m.ep_sharding.get(), true};
      return beluga::load_model(m.cfg, from, ops, max_positions, mla ? &ep : nullptr, &tp);
    };
    m.model = load(0, *m.ops, src);
    m.ep_peers = std::make_unique<ThreadRankPeers>(
        *m.ep_group, std::move(peer_ops), [&](int r, Ops& ops) { return load(r, ops, *m.weights); },
        mla ? RankSplit::kTensorReplicatedCache : RankSplit::kTensorShardedCache, nullptr, fault);
    m.ops->bind_thread();  // the peers bound their devices to this thread while they loaded
    m.model->set_step_peers(m.ep_peers.get());
  } else if (n > 1) {
    BELUGA_CHECK(m.cfg.n_routed_experts >= n, "--expert-parallel-size ", n, " needs at least ", n,
                 " routed experts; the model has ", m.cfg.n_routed_experts);
    LocalTransport transport;
    std::vector<std::unique_ptr<Ops>> peer_ops = peer_backends(m, ma, n, transport);
    m.ep_group = std::make_unique<LocalGroup>(n, std::move(transport));
    if (ma.eplb) {
      m.ep_live = std::make_unique<LiveExpertPlacement>(deepseek_moe_layers(m.cfg, *m.weights),
                                                        m.cfg.n_routed_experts, n, *ma.eplb);
      m.ep_live->set_source(m.weights.get());  // kept open: a rebalance loads moved experts from it
      m.ep_sharding = std::make_unique<ExpertSharding>(m.ep_live->initial_sharding());
    } else {
      m.ep_sharding = std::make_unique<ExpertSharding>(ExpertSharding::contiguous(m.cfg.n_routed_experts, n));
    }
    const ExpertParallelism ep{&m.ep_group->communicator(0), m.ep_sharding.get(), !ma.data_parallel,
                               m.ep_live.get()};
    m.model = beluga::load_model(m.cfg, src, *m.ops, ma.max_model_len, &ep);
    m.ep_peers = std::make_unique<ThreadRankPeers>(m.cfg, *m.weights, m.model->max_positions(), *m.ep_group,
                                                   *m.ep_sharding, std::move(peer_ops), m.ep_live.get(),
                                                   fault, ma.data_parallel);
    m.ops->bind_thread();  // the peers bound their devices to this thread while they loaded
    m.model->set_step_peers(m.ep_peers.get());
  } else {
    m.model = beluga::load_model(m.cfg, src, *m.ops, ma.max_model_len);
  }
  m.model->set_enforce_eager(ma.enforce_eager);
#ifdef BELUGA_WITH_CUDA
  if (ma.device == "cuda") {
    auto& cuda = static_cast<CudaOps&>(*m.ops);
    if (cuda.deterministic()) cuda.set_deterministic_keys(m.model->max_positions());
    m.model->set_sampler(std::make_unique<CudaSampleRows>(cuda));
  }
#endif
  if (ma.device == "cpu") m.model->set_sampler(std::make_unique<HostSampleRows>());
}

}  // namespace

LoadedModel load_model_dir(const ModelArgs& ma) {
  LoadedModel m;
  m.dir = ma.dir;
  BELUGA_CHECK(file_exists(ma.config_path), "no config.json at ", ma.config_path);
  m.cfg = ModelConfig::from_file(ma.config_path);
  m.device = ma.device;
  if (const std::string why = tensor_parallel_refusal(m.cfg, ma.tensor_parallel_size); !why.empty())
    fail(why);
  BELUGA_CHECK(!ma.deterministic || ma.device == "cpu" || m.cfg.arch != Arch::kDeepseekV4,
               "--deterministic on CUDA covers DeepSeek V2/V3 and Llama/Qwen; DeepSeek-V4's step ops are not "
               "batch invariant there yet (docs/deterministic.md)");
  const std::string& fmt = ma.load_format;
  const auto t0 = std::chrono::steady_clock::now();
  if (ma.device == "cpu") {
    auto cpu = std::make_unique<CpuOps>(ma.cpu);
    m.cpu = cpu.get();
    m.ops = std::move(cpu);
    if (fmt == "dummy") m.weights = std::make_unique<DummyWeights>();
  } else {
#ifdef BELUGA_WITH_CUDA
    CudaOptions co;
    co.deterministic = ma.deterministic;
    auto cuda = std::make_unique<CudaOps>(co);
    if (fmt == "dummy")
      m.weights = std::make_unique<IdTablesFrom>(std::make_unique<CudaDummyWeights>(*cuda),
                                                 std::make_unique<DummyWeights>());
    m.ops = std::move(cuda);
#endif
  }
  if (!m.weights) m.weights = std::make_unique<Checkpoint>(ma.dir);
  std::FILE* progress_out = (ma.progress_lines || isatty(fileno(stderr))) ? stderr : nullptr;
  Progress progress("loading " + std::filesystem::path(ma.dir).filename().string(), m.weights->total_bytes(),
                    Progress::Unit::kBytes, progress_out);
  ProgressSource counted(*m.weights, progress);
  kv::FingerprintingSource recorded(counted);  // the KV tiers' model fingerprint
  load_ranks(m, ma, group_ranks(ma), recorded, ma.ep_fault);
  progress.finish();
  m.weights_digest = recorded.digest();
  m.config_path = ma.config_path;
  m.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

void reload_expert_parallel(LoadedModel& m, const ModelArgs& ma, int ep_size, std::vector<int> peer_devices) {
  BELUGA_CHECK(ep_size >= 1, "expert parallelism: no rank left to restart with");
  // The live placement first (it waits for a preparation loading through the models), then rank 0's
  // model, then the peers (they stop after it), then what they shared.
  m.ep_live.reset();
  m.model.reset();
  m.ep_peers.reset();
  m.ep_sharding.reset();
  m.ep_group.reset();
  m.ep_devices.clear();
  ModelArgs again = ma;
  (ma.tensor_parallel_size > 1 ? again.tensor_parallel_size : again.expert_parallel_size) = ep_size;
  again.ep_peer_devices = std::move(peer_devices);
  if (ep_size == 1) again.eplb.reset();  // nothing to balance
  const auto t0 = std::chrono::steady_clock::now();
  load_ranks(m, again, ep_size, *m.weights, InjectedRankFault{});
  m.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

MlaMode mla_mode_for(const ModelArgs& ma, MlaMode asked) {
  if (!ma.deterministic) return asked;
  BELUGA_CHECK(asked != MlaMode::kExpanded,
               "--deterministic attends in the absorbed form (not --mla-mode expanded)");
  return MlaMode::kAbsorbed;
}

LoadedModel load_model_from_args(const Args& args) {
  const ModelArgs ma = parse_model_args(args);
  args.check_all_used();
  return load_model_dir(ma);
}

}  // namespace beluga::cli
