// ModelConfig: the config.json of a shipped GDN / KDA byte-level model
// (flash-linear-attention's GatedDeltaNetConfig / KDAConfig keys).
//
//   ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::Load(dir + "/config.json"));
//   ModelGeometry g = c.Geometry();   // arch, layers, heads, d_k, d_v, scale
//
// Only the features the shipped models use are supported: short conv on,
// output gate on, SwiGLU MLP ("swish"), expand_v giving an integral d_v.
// Anything else is kInvalidArgument naming the key, so a model we cannot run
// exactly is refused instead of run approximately.
#ifndef STATECACHE_CLIENT_MODEL_MODEL_CONFIG_H_
#define STATECACHE_CLIENT_MODEL_MODEL_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/layout/geometry.h"

namespace statecache {

struct ModelConfig {
  Arch arch = Arch::kGdn;          // model_type "gated_deltanet" or "kda"
  int hidden_size = 0;             // D
  int head_dim = 0;                // d_k
  int value_dim = 0;               // d_v = head_dim * expand_v
  int num_heads = 0;               // key heads H_k
  int num_v_heads = 0;             // value heads H_v (defaults to num_heads)
  int num_layers = 0;              // num_hidden_layers
  int intermediate_size = 0;       // MLP width
  int vocab_size = 0;
  int conv_size = 0;               // short-conv kernel (4)
  float norm_eps = 1e-6f;
  float l2norm_eps = 1e-6f;
  float scale = 0.0f;              // readout scale (0 = 1/sqrt(head_dim))
  bool tie_word_embeddings = false;
  bool sigmoid_output_gate = false;  // output_gate_activation: "sigmoid" (KDA) / "swish" (GDN)

  // Parses and validates config.json text.
  static absl::StatusOr<ModelConfig> FromJson(absl::string_view json);
  // Reads `path`; kNotFound when it does not exist.
  static absl::StatusOr<ModelConfig> Load(const std::string& path);

  ModelGeometry Geometry() const;
  // Channels of the short convolution: q, k, v projections concatenated.
  int ConvChannels() const { return num_heads * head_dim * 2 + num_v_heads * value_dim; }
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_MODEL_CONFIG_H_
