#include "client/model/model_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/io/json.h"

namespace statecache {

namespace {

absl::Status Bad(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, ": ", why));
}

absl::StatusOr<const JsonValue*> Get(const JsonValue& root, absl::string_view key) {
  const JsonValue* v = root.Find(key);
  if (v == nullptr) return Bad(key, "missing");
  return v;
}

absl::StatusOr<int> GetInt(const JsonValue& root, absl::string_view key, int lo, int hi) {
  ASSIGN_OR_RETURN(const JsonValue* v, Get(root, key));
  auto i = v->AsInt64();
  if (!i.ok()) return Bad(key, i.status().message());
  if (*i < lo || *i > hi) return Bad(key, absl::StrCat(*i, " is outside [", lo, ", ", hi, "]"));
  return static_cast<int>(*i);
}

absl::StatusOr<double> GetDouble(const JsonValue& root, absl::string_view key, double dflt) {
  const JsonValue* v = root.Find(key);
  if (v == nullptr) return dflt;
  auto d = v->AsDouble();
  if (!d.ok()) return Bad(key, d.status().message());
  return *d;
}

absl::StatusOr<bool> GetBool(const JsonValue& root, absl::string_view key, bool dflt) {
  const JsonValue* v = root.Find(key);
  if (v == nullptr) return dflt;
  auto b = v->AsBool();
  if (!b.ok()) return Bad(key, b.status().message());
  return *b;
}

absl::StatusOr<std::string> GetString(const JsonValue& root, absl::string_view key,
                                      absl::string_view dflt) {
  const JsonValue* v = root.Find(key);
  if (v == nullptr) return std::string(dflt);
  auto s = v->AsString();
  if (!s.ok()) return Bad(key, s.status().message());
  return *s;
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(absl::string_view json) {
  auto root_or = ParseJson(json);
  if (!root_or.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", root_or.status().message()));
  }
  const JsonValue& root = *root_or;
  if (!root.is_object()) return Bad("(top level)", "not a JSON object");

  ModelConfig c;
  ASSIGN_OR_RETURN(std::string type, GetString(root, "model_type", ""));
  if (type == "gated_deltanet") {
    c.arch = Arch::kGdn;
  } else if (type == "kda") {
    c.arch = Arch::kKda;
  } else {
    return Bad("model_type", absl::StrCat("\"", type, "\" (expected gated_deltanet or kda)"));
  }
  ASSIGN_OR_RETURN(c.hidden_size, GetInt(root, "hidden_size", 1, 1 << 16));
  ASSIGN_OR_RETURN(c.head_dim, GetInt(root, "head_dim", 1, kMaxHeadDim));
  ASSIGN_OR_RETURN(c.num_heads, GetInt(root, "num_heads", 1, kMaxHeads));
  c.num_v_heads = c.num_heads;
  if (root.Find("num_v_heads") != nullptr && !root.Find("num_v_heads")->is_null()) {
    ASSIGN_OR_RETURN(c.num_v_heads, GetInt(root, "num_v_heads", 1, kMaxHeads));
  }
  ASSIGN_OR_RETURN(c.num_layers, GetInt(root, "num_hidden_layers", 1, kMaxLayers));
  ASSIGN_OR_RETURN(c.intermediate_size, GetInt(root, "intermediate_size", 1, 1 << 20));
  ASSIGN_OR_RETURN(c.vocab_size, GetInt(root, "vocab_size", 1, 1 << 24));
  ASSIGN_OR_RETURN(c.conv_size, GetInt(root, "conv_size", 1, 64));

  ASSIGN_OR_RETURN(double expand_v, GetDouble(root, "expand_v", 1.0));
  const double dv = expand_v * c.head_dim;
  if (!(dv >= 1.0) || dv != std::floor(dv) || dv > kMaxHeadDim) {
    return Bad("expand_v", absl::StrCat(expand_v, " * head_dim is not an integer in [1, 256]"));
  }
  c.value_dim = static_cast<int>(dv);

  ASSIGN_OR_RETURN(double norm_eps, GetDouble(root, "norm_eps", 1e-6));
  ASSIGN_OR_RETURN(double l2_eps, GetDouble(root, "l2norm_eps", 1e-6));
  if (!(norm_eps > 0) || !(l2_eps > 0)) return Bad("norm_eps", "epsilons must be positive");
  c.norm_eps = static_cast<float>(norm_eps);
  c.l2norm_eps = static_cast<float>(l2_eps);
  ASSIGN_OR_RETURN(double scale, GetDouble(root, "scale", 0.0));
  if (!(scale >= 0) || !std::isfinite(scale)) return Bad("scale", "must be finite and >= 0");
  c.scale = static_cast<float>(scale);

  ASSIGN_OR_RETURN(std::string act, GetString(root, "hidden_act", "swish"));
  if (act != "swish" && act != "silu") return Bad("hidden_act", "only swish (SwiGLU) is supported");
  ASSIGN_OR_RETURN(bool use_gate, GetBool(root, "use_gate", true));
  if (!use_gate) return Bad("use_gate", "false is not supported");
  ASSIGN_OR_RETURN(bool use_conv, GetBool(root, "use_short_conv", true));
  if (!use_conv) return Bad("use_short_conv", "false is not supported");
  ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(root, "tie_word_embeddings", false));
  ASSIGN_OR_RETURN(std::string gate_act, GetString(root, "output_gate_activation",
                                                   c.arch == Arch::kKda ? "sigmoid" : "swish"));
  if (gate_act == "sigmoid") {
    c.sigmoid_output_gate = true;
  } else if (gate_act == "swish" || gate_act == "silu") {
    c.sigmoid_output_gate = false;
  } else {
    return Bad("output_gate_activation", absl::StrCat("\"", gate_act, "\" (swish or sigmoid)"));
  }

  absl::Status geo = c.Geometry().Validate();
  if (!geo.ok()) return Bad("heads/dims", geo.message());
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("config: cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = FromJson(ss.str());
  if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

ModelGeometry ModelConfig::Geometry() const {
  ModelGeometry g;
  g.arch = arch;
  g.layers = num_layers;
  g.h_qk = num_heads;
  g.h_v = num_v_heads;
  g.d_k = head_dim;
  g.d_v = value_dim;
  g.scale = scale;
  return g;
}

}  // namespace statecache
