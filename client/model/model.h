// The reference CPU forward pass of the shipped GDN / KDA byte-level models
// (../shared/models/README.md), with the recurrence delegated to a
// RecurrentStateStore.
//
// LanguageModel holds the immutable weights (bf16 in the file, FP32 in memory) and a
// thread pool; ModelSession holds one sequence: the short-convolution windows
// (the last conv_size-1 projected inputs per channel and layer) and a
// RecurrentStateStore (not owned) with the recurrent states.
//
//   ASSIGN_OR_RETURN(auto model, LanguageModel::Load(dir, {}));
//   Fp32StateStore store(model->config().Geometry(), model->pool());
//   ModelSession session(model.get(), &store);
//   std::vector<float> logits;   // [T, vocab]
//   RETURN_IF_ERROR(session.Forward(tokens, RecurrentMode::kPrefill, &logits));
//   RETURN_IF_ERROR(session.Forward({next}, RecurrentMode::kDecode, &logits));
//
// Forward runs layer-major: all T tokens through layer 0, then layer 1, ...
// Every input of layer l depends only on layer l-1 and earlier tokens, so
// this computes exactly what token-by-token processing would; the matmuls
// become T-row GEMMs. In kDecode mode the store runs T separate decode steps
// per layer (each stores, and requantizes, the state); in kPrefill mode one
// chunk per layer (stored once at the end). With FP32 states both agree.
//
// Thread-safety: LanguageModel is immutable and shareable; a ModelSession is not
// thread-safe.
#ifndef STATECACHE_CLIENT_MODEL_MODEL_H_
#define STATECACHE_CLIENT_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/model/model_config.h"
#include "client/model/recurrent_state_store.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/io/safetensors.h"

namespace statecache {

enum class RecurrentMode : uint8_t { kDecode, kPrefill };

// FP32 weights of one layer. Matrices are [out, in] row-major. The
// projections that read the normalized attention input are fused into one
// matrix `attn_in` with rows in this order:
//   q [h_k*d_k], k [h_k*d_k], v [h_v*d_v], b [h_v],
//   GDN: a [h_v], g_proj [h_v*d_v];   KDA: f_proj.0 [r_f], g_proj.0 [r_g].
struct LayerWeights {
  std::vector<float> attn_norm;   // [D]
  std::vector<float> attn_in;     // [attn_in_rows, D]
  std::vector<float> conv;        // [conv_channels, conv_size] (q, k, v channels)
  std::vector<float> a_log;       // [h_v]
  std::vector<float> dt_bias;     // GDN [h_v]; KDA [h_v*d_k]
  std::vector<float> f_proj1;     // KDA [h_v*d_k, r_f]
  std::vector<float> g_proj1;     // KDA [h_v*d_v, r_g]
  std::vector<float> g_proj1_bias;  // KDA [h_v*d_v]
  std::vector<float> o_norm;      // [d_v]
  std::vector<float> o_proj;      // [D, h_v*d_v]
  std::vector<float> mlp_norm;    // [D]
  std::vector<float> gate_up;     // [2*I, D]: gate_proj rows, then up_proj rows
  std::vector<float> down_proj;   // [D, I]
};

class LanguageModel {
 public:
  struct Options {
    int threads = 0;  // 0 = hardware concurrency
  };

  // Reads <dir>/config.json and <dir>/model.safetensors. kNotFound for a
  // missing file; kInvalidArgument naming the tensor for a missing, extra or
  // mis-shaped weight or a non-float dtype.
  static absl::StatusOr<std::unique_ptr<LanguageModel>> Load(const std::string& dir,
                                                     const Options& options);
  static absl::StatusOr<std::unique_ptr<LanguageModel>> FromParts(const ModelConfig& config,
                                                          const SafetensorsFile& weights,
                                                          const Options& options);

  const ModelConfig& config() const { return config_; }
  ThreadPool* pool() const { return pool_.get(); }
  const LayerWeights& layer(int l) const { return layers_[l]; }
  const std::vector<float>& embeddings() const { return embeddings_; }  // [V, D]
  const std::vector<float>& final_norm() const { return final_norm_; }  // [D]
  const std::vector<float>& lm_head() const { return lm_head_; }        // [V, D]
  // Low-rank widths of KDA's f_proj / g_proj (0 for GDN).
  int f_rank() const { return f_rank_; }
  int g_rank() const { return g_rank_; }
  int attn_in_rows() const { return attn_in_rows_; }

 private:
  LanguageModel() = default;

  ModelConfig config_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<LayerWeights> layers_;
  std::vector<float> embeddings_, final_norm_, lm_head_;
  int f_rank_ = 0, g_rank_ = 0, attn_in_rows_ = 0;
};

// Activated recurrent inputs per layer, as the golden file stores them:
// q, k [T, h_k, d_k] (L2-normalized), v [T, h_v, d_v], g [T, h_v] or
// [T, h_v, d_k], beta [T, h_v].
struct ForwardTrace {
  struct Layer {
    std::vector<float> q, k, v, g, beta;
  };
  std::vector<Layer> layers;
};

class ModelSession {
 public:
  // `model` and `store` must outlive the session; the store's geometry must
  // match the model (checked on first use: kInvalidArgument).
  ModelSession(const LanguageModel* model, RecurrentStateStore* store);

  // Runs `tokens` (each in [0, vocab)) after everything run so far.
  // logits: resized to [T, vocab] (nullptr: skip the LM head). trace: per
  // layer recurrent inputs of these tokens (nullptr: not recorded).
  // On error the session is in an unspecified state; Reset() it.
  absl::Status Forward(absl::Span<const int32_t> tokens, RecurrentMode mode,
                       std::vector<float>* logits, ForwardTrace* trace = nullptr);

  // Zero conv windows and recurrent states; position 0.
  absl::Status Reset();
  // Tokens consumed since the last Reset.
  int64_t position() const { return position_; }
  RecurrentStateStore* store() const { return store_; }

  // The short-conv window of one layer as bytes: float32 little-endian
  // [conv_channels, conv_size - 1] (q, k, v channels; oldest input first).
  // These are the "auxiliary bytes" a checkpoint stores beside the states.
  absl::StatusOr<std::string> ExportConvState(int layer) const;
  // kInvalidArgument for a bad layer or byte count.
  absl::Status ImportConvState(int layer, absl::string_view bytes);
  // All layers, concatenated in layer order; and back (position unchanged).
  std::string ExportAuxBytes() const;
  absl::Status ImportAuxBytes(absl::string_view bytes);
  int64_t ConvStateBytesPerLayer() const;

 private:
  absl::Status RunLayer(int l, int t_count, RecurrentMode mode, std::vector<float>& h,
                        ForwardTrace::Layer* trace);

  const LanguageModel* model_;
  RecurrentStateStore* store_;
  int64_t position_ = 0;
  std::vector<std::vector<float>> conv_state_;  // per layer [C, W-1]
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_MODEL_H_
