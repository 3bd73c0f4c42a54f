// Model: a checkpoint's weights on a backend, and one forward step over a Batch.
// The architecture-specific parts (DeepSeek MLA+MoE, dense Llama/Qwen) implement this interface;
// load_model picks one from the config.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/sample_rows.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/batch.h"
#include "model/data_parallel_split.h"
#include "model/decode_graphs.h"
#include "parallel/expert_parallel.h"

namespace beluga {

enum class MlaMode { kAuto, kExpanded, kAbsorbed };

struct ForwardOptions {
  MlaMode mla_mode = MlaMode::kAuto;
  // When set: the hidden state of token row `capture_row` after the embedding, after each layer and
  // after the final norm (for layer-by-layer comparison with a reference).
  std::vector<std::vector<float>>* hidden_capture = nullptr;
  int capture_row = -1;
  // When set: greedy sampling on the device. Each logit row's argmax (ties: the lowest id) goes here
  // and `logits` is not written, so the step copies R ids instead of R x vocab floats.
  int32_t* greedy_tokens = nullptr;
  // With greedy_tokens: each row's softmax probability of its argmax here too (a draft's confidence).
  float* greedy_probs = nullptr;
  // So steps follow each other on the device without a host round trip: with `device_greedy` (I32
  // [>= DecodeGraphs::logit_rows_bound: a replayed step writes its padding rows too]) the argmaxes,
  // and with `device_greedy_probs` (F32, as many) their
  // probabilities, stay in these device tensors and nothing is copied to the host (the call returns
  // once the step is queued). mtp_forward() only: `device_ids` (I32, >= the step's token rows) gives
  // the step's token ids in place of batch.tokens, whose values must still be valid ids (padding rows
  // read them).
  Tensor device_greedy, device_greedy_probs;
  const Tensor* device_ids = nullptr;
  // mtp_forward() only: token row t takes row hidden_rows[t] of the `hidden` input (the step gathers
  // them itself, inside its graph); empty: row t. With `ids_from_hidden_rows` (and device_ids) its
  // token id is (*device_ids)[hidden_rows[t]] too: the argmax the previous pass left at that row.
  std::span<const int32_t> hidden_rows;
  bool ids_from_hidden_rows = false;
  // When set: the final-normed hidden state of every token row is copied here (a persistent device
  // tensor of at least [tokens, hidden] in the backend's activation dtype): the MTP module's input.
  Tensor* final_hidden = nullptr;
  // When set (with `sampled`, and a sampler: Model::set_sampler): sampling on the device with one
  // DeviceSampleRow per logit row; `sampled` gets [logit rows, kSampleOutCols] I32 and `logits` is not
  // written. Decode steps run it inside their recorded graphs.
  const DeviceSampling* sampling = nullptr;
  int32_t* sampled = nullptr;
  // With `sampling`: called (on the forward's thread) once the step's logits are computed on the
  // device and before `sampling` is read, so its masks may be filled meanwhile. true: sample on the
  // device as above; false: the logits go to `logits` instead (for the host sampler).
  std::function<bool()> before_sampling;
};

struct MtpWeights;
class LiveExpertPlacement;

// Other ranks of an expert-parallel group that step with this model (replicated tokens: each runs
// the same batch on its own copy of the KV cache). Model::forward hands them each batch before its
// own layers run (their MoE layers exchange rows with this model's) and waits for them after.
// Speculative decoding's MTP steps go the same way (mtp_forward with MtpPeerRows).
class StepPeers {
 public:
  virtual ~StepPeers() = default;
  // `keep_hidden`: each peer keeps the step's final hidden states (the MTP step's inputs).
  virtual void begin(const Batch& b, int num_blocks, bool keep_hidden) = 0;
  // An MTP step over `b` on every peer, into its own MTP cache of `num_blocks` blocks; its input row t
  // is row rows[t] of the peer's last forward's final hidden states, or (`chained`) of its last MTP
  // step's output.
  virtual void begin_mtp(const Batch& b, int num_blocks, std::span<const int32_t> rows, bool chained) = 0;
  // Between steps: the KV copies of blocks (the engine's ids) between the group's caches of
  // `num_blocks` blocks and host images (KV tiers; `to_host`: saves, else loads; `with_mtp`: the
  // images end with the MTP layer's slice). The peers do their part before this returns; the caller
  // does the part returned (valid until the next call). Replicated ranks hold the same blocks: every
  // rank loads every image, and saves read the caller's cache. Data-parallel ranks each copy the
  // blocks they hold, with their cache's ids.
  virtual std::span<const KvBlockCopy> copy_blocks(std::span<const KvBlockCopy> copies, bool to_host,
                                                   int num_blocks, bool with_mtp) = 0;
  // The group's ranks, the caller's included.
  virtual int ranks() const = 0;
  // The ranks whose caches each hold a slice of every block (tensor parallel: all, each its own
  // heads; else 1): a block's image is their slices in rank order, and copy_blocks moves each
  // rank's slice at its offset (rank r: r / cache_shards() of the image).
  virtual int cache_shards() const { return 1; }
  // Attention data parallel (model/data_parallel_split.h): true when each rank steps only the
  // sequences whose blocks it holds, `num_blocks` of them a rank. begin_parts() splits `b`, starts
  // every peer on its part, writing its rows into `out`, and returns the caller's part (valid until
  // the next begin).
  virtual bool data_parallel() const { return false; }
  virtual const RankPart& begin_parts(const Batch& b, int num_blocks, const PartOutputs& out,
                                      bool keep_hidden) = 0;
  // An MTP step split likewise: token row t of `b` reads row hidden_rows[t] (empty: t) of the last
  // forward's final hidden states, or (`chained`) of the last MTP step's output, on the rank holding
  // its sequence; the caller's part says where in its own (RankPart::source_rows).
  virtual const RankPart& begin_mtp_parts(const Batch& b, int num_blocks,
                                          std::span<const int32_t> hidden_rows, bool chained,
                                          const PartOutputs& out) = 0;
  virtual void end() = 0;    // waits for the step; throws the group's failure (a peer's error)
  virtual void abort() = 0;  // this rank failed mid-step: the peers' collectives throw instead of waiting
};

class Model {
 public:
  virtual ~Model();
  const ModelConfig& config() const { return cfg_; }
  Ops& ops() const { return ops_; }

  // The paged cache's tensors (KvCache::layers, in order): each [num_blocks, rows_per_block,
  // width], block b of every tensor holding the state of tokens [64 b, 64 b + 64) of a sequence.
  // Default: one tensor per layer of kKvBlockSize rows of kv_entry_dim(); DeepSeek-V4 adds its
  // compressed entries.
  struct KvTensorShape {
    int64_t rows_per_block, width;
  };
  virtual std::vector<KvTensorShape> kv_layout() const;
  // A zeroed paged cache with `num_blocks` blocks (kv_layout()).
  KvCache make_kv_cache(int num_blocks) const;
  size_t kv_bytes_per_token() const;  // across all layers, in the backend's cache dtype
  int64_t num_parameters() const { return n_params_; }
  int max_positions() const { return max_positions_; }

  // Runs all tokens of `batch`, writing their KV into `kv` and the logits of batch.logit_rows
  // to `logits` (host, [logit_rows, vocab] F32; unused with opt.greedy_tokens).
  // Decode steps replay recorded graphs on backends that support them (see DecodeGraphs) unless
  // `enforce_eager` is set (as vLLM's --enforce-eager); results are the same up to rounding.
  void forward(const Batch& batch, KvCache& kv, float* logits, const ForwardOptions& opt = {});
  // (An expert-parallel model is loaded eager and stays so: its steps exchange rows planned on the host.)
  void set_enforce_eager(bool on) { enforce_eager_ = on || always_eager_; }
  // Whether the last forward() (this rank's) replayed a recorded CUDA graph (traces).
  bool last_forward_graphed() const { return last_graphed_; }
  // Whether decode steps of uniform shape replay graphs (then padding a step to one shape is free).
  bool replays_graphs() const { return !enforce_eager_ && ops_.supports_graphs(); }
  // The group's other ranks (not owned; null: none).
  void set_step_peers(StepPeers* peers) { peers_ = peers; }
  bool has_step_peers() const { return peers_ != nullptr; }
  StepPeers* step_peers() const { return peers_; }
  // The backend's device sampler (backend/sample_rows.h; the CLI gives CUDA's), which
  // ForwardOptions::sampling needs; null: none (the CPU backend samples on the host).
  void set_sampler(std::unique_ptr<SampleRowsOp> sampler);
  bool has_sampler() const { return sampler_ != nullptr; }
  // Most logit rows and mask rows one step may sample on the device.
  static constexpr int kMaxSampleRows = 4096, kMaxMaskRows = 256;
  static constexpr int kMaxSampleEdits = 1 << 20;  // logit edits (bias, penalties) of one step
  // Graphs recorded for forward() (plain and sampling decode; verify steps replay theirs too) and for
  // mtp_forward() (proposal steps).
  int num_graphs() const {
    return (graphs_ ? graphs_->num_graphs() : 0) + (sample_graphs_ ? sample_graphs_->num_graphs() : 0);
  }
  int num_mtp_graphs() const { return mtp_graphs_ ? mtp_graphs_->num_graphs() : 0; }

  // The MTP module (mtp.h), when the checkpoint has one (num_nextn_predict_layers > 0).
  bool has_mtp() const { return mtp_ != nullptr; }
  KvCache make_mtp_kv_cache(int num_blocks) const;  // one layer, same blocks as the main cache
  size_t mtp_kv_bytes_per_token() const;            // that layer's (0 without an MTP module)
  // One MTP step over `batch`: row t is (batch.tokens[t] = x_{i+1}, hidden row t = h_i) at position
  // i = context_len + j of its sequence, i.e. a sequence's MTP positions are its main positions.
  // Writes MTP KV into `kv`, the logits (or argmaxes, opt.greedy_tokens) of batch.logit_rows like
  // forward(), and, with opt.final_hidden, its own normed output per row (the next chained row's h).
  // Steps of uniform query length replay graphs as forward() does, when `hidden` and
  // opt.final_hidden hold the padded rows (DecodeGraphs::padded_rows).
  // With step peers, `peer_rows` says where each peer finds its input rows (StepPeers::begin_mtp).
  struct MtpPeerRows {
    std::span<const int32_t> rows;
    bool chained = false;
  };
  void mtp_forward(const Batch& batch, const Tensor& hidden, KvCache& kv, float* logits,
                   const ForwardOptions& opt = {}, const MtpPeerRows* peer_rows = nullptr);
  // Attention data parallel: one rank's part of a step (its own cache), its logit rows written to
  // their rows of `out`; a part without tokens still takes part in the group's exchanges
  // (idle_step). forward() calls it on rank 0 when its peers are data parallel, each peer on its own.
  // `final_hidden`: this rank's part's final hidden states, by its local rows (an MTP step's inputs).
  void forward_part(const RankPart& part, KvCache& kv, const PartOutputs& out,
                    Tensor* final_hidden = nullptr);
  // The MTP step's part: its rows read `hidden` at part.source_rows; its output into final_hidden.
  void mtp_forward_part(const RankPart& part, const Tensor& hidden, KvCache& kv, const PartOutputs& out,
                        Tensor* final_hidden);

 protected:
  // This rank's part of forward() / mtp_forward(); `step` between the peers' begin and end (abort on
  // an exception).
  void mtp_forward_local(const Batch& batch, const Tensor& hidden, KvCache& kv, float* logits,
                         const ForwardOptions& opt);
  // The argmaxes (and probabilities) of the head's logits at x[rows] into opt.device_greedy(_probs),
  // on the device (Ops::head_argmax): a step that keeps its greedy tokens computes no logits.
  void keep_greedy(const Tensor& x, const Tensor& rows, const Weight& head, const ForwardOptions& opt);
  void with_peers(const std::function<void()>& step);
  // A step with no tokens on this rank of a data-parallel group: every collective the layers run
  // (an expert-parallel MoE's exchanges, with zero rows of its own), nothing else.
  // `mtp`: an MTP step's (the MTP layer's exchanges only).
  virtual void idle_step(bool mtp);
  // A part's step through `run` (given this rank's logits buffer and options), its rows then written
  // to their rows of the step.
  void run_part(const RankPart& part, const PartOutputs& out,
                const std::function<void(float* logits, ForwardOptions& opt)>& run);
  Model(const ModelConfig& cfg, Ops& ops);
  // What each architecture supplies for decoder layer l (pre-norm residual blocks):
  // h += attention(norm_in(h)); h += feed_forward(norm_post(h)). Both get their input as a
  // NormedInput still to be formed, so their first op can fold the residual add and the norm in
  // (Ops::norm_linear, Ops::norm_moe_gate); afterwards `in.out` holds the normalized input.
  struct LayerNorms {
    const Tensor& input;
    const Tensor& post;
  };
  virtual LayerNorms layer_norms(int l) const = 0;
  virtual Tensor attention(int l, const NormedInput& in, const AttnMeta& meta, const Tensor& positions,
                           Tensor cache, const ForwardOptions& opt, int max_query_len) = 0;
  // Writes into `out` [T, D] (a buffer that outlives the layer's scratch).
  virtual void feed_forward(int l, const NormedInput& in, Tensor out) = 0;
  // Counts the parameters into *params (null: the model's; a reload after load counts none).
  Weight load_linear(WeightSource& src, const std::string& prefix, int64_t out, int64_t in,
                     int64_t* params = nullptr);
  // Part `part` of `parts` of a linear layer (parallel/tensor_parallel.h): `dim` 0 its rows (column
  // parallel; the bias split likewise), 1 its columns (row parallel; the bias on part 0 alone, as the
  // parts' outputs are summed). FP8 parts must fall on the scale blocks. Counts the whole layer.
  // `owners` (row parts and whole layers only): upload into memory of its own (Ops::upload_owned),
  // its owners appended.
  Weight load_linear_part(WeightSource& src, const std::string& prefix, int64_t out, int64_t in, int dim,
                          int part, int parts, int64_t* params = nullptr,
                          std::vector<std::shared_ptr<void>>* owners = nullptr);
  // beluga::load_stacked (stacked_weight.h) with the config's FP8 blocks, counting the parameters.
  Weight load_stacked(WeightSource& src, const std::vector<std::string>& prefixes,
                      const std::vector<int64_t>& outs, int64_t in);
  Tensor load_vector(WeightSource& src, const std::string& name, int64_t n);
  void capture(const ForwardOptions& opt, const Tensor& h);
  StepPlan plan_step(const Batch& b, const KvCache& kv, int layers = -1) const;  // validates the batch
  // The step's metadata uploaded to the device (into scratch); ids and positions too.
  AttnMeta upload_meta(const StepPlan& p, Tensor* ids, Tensor* pos);
  // Loads the MTP module's own weights (mtp.cc); its decoder layer is the architecture's layer
  // cfg_.num_layers, loaded by the architecture.
  void load_mtp(WeightSource& src);
  // The MTP step from device inputs (mtp.cc), the body of mtp_forward's eager and graph paths.
  Tensor mtp_body(const DecodeGraphs::Inputs& in, const Tensor& hidden, KvCache& kv,
                  const ForwardOptions& opt);
  // Embedding, layers, then the F32 logits [rows, vocab] of the given rows (none: empty `rows`).
  // Virtual for architectures whose step is not a stack of pre-norm residual layers (DeepSeek-V4).
  virtual Tensor step_body(const AttnMeta& meta, const Tensor& ids, const Tensor& pos, const Tensor& rows,
                           KvCache& kv, const ForwardOptions& opt, int max_query_len);
  // From the embedded tokens to the final-normed hidden states [T, D].
  Tensor run_layers(Tensor hidden, const AttnMeta& meta, const Tensor& positions, KvCache& kv,
                    const ForwardOptions& opt, int max_query_len);

  ModelConfig cfg_;
  Ops& ops_;
  Tensor embed_;
  Weight lm_head_;
  Tensor final_norm_;
  RopeTable rope_;
  int64_t n_params_ = 0;
  int max_positions_ = 0;
  bool enforce_eager_ = false;
  bool always_eager_ = false;  // steps no graph can hold (expert-parallel collectives)
  bool last_graphed_ = false;
  StepPeers* peers_ = nullptr;
  void forward_local(const Batch& batch, KvCache& kv, float* logits, const ForwardOptions& opt);
  std::unique_ptr<DecodeGraphs> graphs_;      // made on the first step that qualifies
  std::unique_ptr<DecodeGraphs> mtp_graphs_;  // the MTP module's, likewise
  // Device sampling: the sampler, its inputs (persistent, so recorded graphs read this step's), and
  // the decode graphs whose body ends in the sampler (a graph per shape, as graphs_ keeps; their
  // output is the sampled rows, not the logits).
  std::unique_ptr<SampleRowsOp> sampler_;
  Tensor sample_params_, sample_masks_;
  Tensor sample_edits_, sample_edit_raw_, sample_lse_;  // SampleEdits: the entries and their scratch
  SampleEdits sample_edit_args() const { return {sample_edits_, sample_edit_raw_, sample_lse_}; }
  Tensor sampled_out_;  // [kMaxSampleRows, kSampleOutCols]: a split step's sampled rows (not scratch)
  std::unique_ptr<DecodeGraphs> sample_graphs_;
  // The sampling half of a step split by ForwardOptions::before_sampling, on its logits `lg`.
  void finish_sampling(const Tensor& lg, float* logits, const ForwardOptions& opt);
  // Uploads the step's rows and masks; then the sampler on `lg`'s rows into scratch I32 [R, 4].
  void upload_sampling(const DeviceSampling& s, size_t logit_rows);
  Tensor sample_logits(const Tensor& lg);
  std::unique_ptr<MtpWeights> mtp_;
  // forward_part's host rows before they go to their rows of the step (reused).
  std::vector<float> part_logits_, part_probs_;
  std::vector<int32_t> part_ids_;
};

// This rank's place in an expert-parallel group: its communicator and the group's expert sharding
// (both outlive the model). The model then loads only the routed experts of the rank's slots and
// its MoE layers run ExpertParallelMoe, so every rank of the group must step its model at the same
// time (each with its own batch: attention is data parallel). DeepSeek V2/V3 only.
struct ExpertParallelism {
  Communicator* comm = nullptr;
  const ExpertSharding* sharding = nullptr;
  // Every rank steps the same batch (its own copy of the KV cache) and the MoE layers split the
  // tokens over the ranks (ExpertParallelMoe::forward_replicated), so rank 0 alone can serve.
  bool replicated_tokens = false;
  // Live EPLB (not owned; null: `sharding` for every layer, fixed): each MoE layer routes by the
  // placement's map for it, with the weights the placement holds, and counts its routing there;
  // `sharding` is then its initial map. The model attaches its experts and its expert loader at load.
  LiveExpertPlacement* live = nullptr;
};

// This rank's place in a tensor-parallel group (Megatron's split, `comm` outlives the model): the
// attention heads, the KV heads and the dense MLP's intermediate size are split into comm->size()
// equal parts, rank r holding part r. q, k, v, gate and up are loaded by rows (column parallel), o
// and down by columns (row parallel), and each of those outputs is summed over the group
// (parallel/tensor_parallel.h, rank order: the same bits on every rank); embeddings, norms and the
// head are replicated. Every rank steps the same batch with a KV cache of its own heads
// (kv_bytes_per_token() is one rank's), and its steps are eager (host-planned collectives).
// Dense Llama/Qwen models; DeepSeek V2/V3 split their query heads (q or q_b, kv_b by rows, o by
// columns) and dense MLP layers, keep the whole latent cache on every rank (the same entries), and
// need expert parallelism over the same ranks with replicated tokens (`ep`, same communicator).
struct TensorParallelism {
  Communicator* comm = nullptr;
};

// Builds the model for `cfg` from `src` (a checkpoint or dummy weights) on `ops`.
// `max_positions` bounds the rope tables (0: the config's max_position_embeddings, capped at 32768).
// `ep`: this rank's expert-parallel group (null: the model holds every expert); `tp`: its
// tensor-parallel group (null: every head).
std::unique_ptr<Model> load_model(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions = 0,
                                  const ExpertParallelism* ep = nullptr,
                                  const TensorParallelism* tp = nullptr);

// Why `cfg` cannot be split over `ranks` tensor-parallel ranks ("" when it can).
std::string tensor_parallel_refusal(const ModelConfig& cfg, int ranks);
// The tensor-parallel group an instance restarts with after ranks failed: the largest size not above
// the healthy ranks that the model splits over (1 always does; 0 when no rank is healthy).
int tensor_parallel_restart_size(const ModelConfig& cfg, int healthy_ranks);

// The MoE layers a DeepSeek V2/V3 model loads from `src`: the config's, then the MTP module's decoder
// layer (model.layers.{num_hidden_layers}) when the checkpoint holds the module.
std::vector<int> deepseek_moe_layers(const ModelConfig& cfg, WeightSource& src);

}  // namespace beluga
