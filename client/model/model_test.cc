// LanguageModel loading errors, session behaviour (conv windows as auxiliary bytes,
// checkpoint-style resume), and the golden logits through the CPU Backend.
#include <cmath>
#include <string>
#include <vector>

#include "client/model/backend_state_store.h"
#include "client/model/fp32_state_store.h"
#include "client/model/model.h"
#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/formats/format.h"
#include "kernels/io/safetensors.h"
#include "kernels/io/test_data.h"
#include "kernels/layout/state_layout.h"

namespace statecache {
namespace {

using absl::StatusCode;

double MaxRel(const std::vector<float>& got, const std::vector<float>& ref) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::fabs(double{got[i]} - ref[i]));
    mag = std::max(mag, std::fabs(double{ref[i]}));
  }
  return diff / mag;
}

std::string ModelDir(const std::string& name) {
  auto p = SharedDataPath("models/" + name);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : "/missing";
}

const char kGdnConfig[] = R"({"model_type": "gated_deltanet", "hidden_size": 512,
  "head_dim": 128, "num_heads": 2, "num_v_heads": 4, "expand_v": 1.0,
  "num_hidden_layers": 4, "intermediate_size": 384, "vocab_size": 256, "conv_size": 4,
  "norm_eps": 1e-06, "l2norm_eps": 1e-06, "hidden_act": "swish", "use_gate": true,
  "use_short_conv": true, "tie_word_embeddings": false, "output_gate_activation": "swish",
  "scale": 0.08838834764831845})";

TEST(ModelConfigTest, ParsesShippedConfigs) {
  auto gdn = ModelConfig::Load(ModelDir("gdn-tiny") + "/config.json");
  ASSERT_TRUE(gdn.ok()) << gdn.status();
  EXPECT_EQ(gdn->arch, Arch::kGdn);
  EXPECT_EQ(gdn->Geometry().DebugString(), "gdn L=4 Hqk=2 Hv=4 dk=128 dv=128 scale=0.0883883");
  EXPECT_FALSE(gdn->sigmoid_output_gate);
  EXPECT_EQ(gdn->ConvChannels(), 2 * 256 + 512);
  auto kda = ModelConfig::Load(ModelDir("kda-tiny") + "/config.json");
  ASSERT_TRUE(kda.ok()) << kda.status();
  EXPECT_EQ(kda->arch, Arch::kKda);
  EXPECT_TRUE(kda->sigmoid_output_gate);
  EXPECT_EQ(kda->num_heads, 4);
  EXPECT_EQ(ModelConfig::Load("/nonexistent/config.json").status().code(), StatusCode::kNotFound);
}

TEST(ModelConfigTest, RejectsWhatWeCannotRunExactly) {
  ASSERT_TRUE(ModelConfig::FromJson(kGdnConfig).ok());
  struct Case {
    std::string from, to, field;
  } cases[] = {
      {"\"gated_deltanet\"", "\"mamba\"", "model_type"},
      {"\"hidden_size\": 512", "\"hidden_size\": -1", "hidden_size"},
      {"\"head_dim\": 128,", "", "head_dim"},
      {"\"expand_v\": 1.0", "\"expand_v\": 0.3", "expand_v"},
      {"\"num_v_heads\": 4", "\"num_v_heads\": 3", "heads"},
      {"\"use_gate\": true", "\"use_gate\": false", "use_gate"},
      {"\"use_short_conv\": true", "\"use_short_conv\": 1", "use_short_conv"},
      {"\"hidden_act\": \"swish\"", "\"hidden_act\": \"gelu\"", "hidden_act"},
      {"\"output_gate_activation\": \"swish\"", "\"output_gate_activation\": \"relu\"",
       "output_gate_activation"},
      {"\"vocab_size\": 256", "\"vocab_size\": 256.5", "vocab_size"},
      {"{", "[", "config.json"},
  };
  for (const Case& c : cases) {
    std::string text = kGdnConfig;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    text.replace(at, c.from.size(), c.to);
    auto r = ModelConfig::FromJson(text);
    ASSERT_FALSE(r.ok()) << c.field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(r.status().message().find(c.field), absl::string_view::npos) << r.status();
  }
}

// Rewrites the shipped weights with one change and checks the load error.
class WeightErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = ModelConfig::Load(ModelDir("gdn-tiny") + "/config.json");
    ASSERT_TRUE(c.ok());
    config_ = *c;
    auto f = SafetensorsFile::Open(ModelDir("gdn-tiny") + "/model.safetensors");
    ASSERT_TRUE(f.ok());
    file_ = std::make_unique<SafetensorsFile>(std::move(*f));
  }
  // Copies every tensor except `drop`, replacing `reshape` by a [1] F32.
  absl::Status LoadModified(const std::string& drop, const std::string& reshape,
                            const std::string& extra, bool int_dtype = false) {
    SafetensorsWriter w;
    for (const std::string& n : file_->names()) {
      if (n == drop) continue;
      auto t = file_->tensor(n);
      if (n == reshape) {
        if (int_dtype) {
          std::string bytes(static_cast<size_t>(t->num_elements()) * 4, '\0');
          EXPECT_TRUE(w.Add(n, SafetensorsDtype::kI32, t->shape, bytes).ok());
        } else {
          EXPECT_TRUE(w.AddFloat32(n, {1}, std::vector<float>{1.0f}).ok());
        }
        continue;
      }
      EXPECT_TRUE(w.Add(n, t->dtype, t->shape, t->bytes).ok());
    }
    if (!extra.empty()) EXPECT_TRUE(w.AddFloat32(extra, {1}, std::vector<float>{0.0f}).ok());
    auto f = SafetensorsFile::FromBytes(w.Serialize());
    EXPECT_TRUE(f.ok());
    return LanguageModel::FromParts(config_, *f, {1}).status();
  }
  ModelConfig config_;
  std::unique_ptr<SafetensorsFile> file_;
};

TEST_F(WeightErrorTest, NamesTheTensor) {
  EXPECT_TRUE(LoadModified("", "", "").ok());
  absl::Status s = LoadModified("model.layers.2.attn.a_proj.weight", "", "");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("missing tensor \"model.layers.2.attn.a_proj.weight\""),
            absl::string_view::npos) << s;
  s = LoadModified("", "model.layers.1.attn.o_norm.weight", "");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.layers.1.attn.o_norm.weight\" has shape [1], expected [128]"),
            absl::string_view::npos) << s;
  s = LoadModified("", "", "model.layers.0.attn.f_proj.0.weight");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unexpected tensors"), absl::string_view::npos) << s;
  s = LoadModified("", "model.norm.weight", "", /*int_dtype=*/true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not a float type"), absl::string_view::npos) << s;
  // A GDN file read with a KDA config: the KDA weights are missing.
  ModelConfig kda = config_;
  kda.arch = Arch::kKda;
  kda.num_heads = 4;
  EXPECT_EQ(LanguageModel::FromParts(kda, *file_, {1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LanguageModel::Load("/nonexistent", {}).status().code(), StatusCode::kNotFound);
}

struct GoldenData {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

GoldenData ReadGolden(const std::string& name) {
  GoldenData g;
  auto f = SafetensorsFile::Open(ModelDir(name) + "/golden.safetensors");
  EXPECT_TRUE(f.ok());
  auto t = f->ToInt64("tokens");
  g.tokens.assign(t->begin(), t->end());
  g.logits = *f->ToFloat32("logits");
  return g;
}

class SessionTest : public ::testing::TestWithParam<std::string> {};

// Resume from a checkpoint: states + conv windows (aux bytes) of session A
// after 40 tokens, imported into a fresh session B, which runs the last 24.
TEST_P(SessionTest, ResumesFromExportedStatesAndConvWindows) {
  auto model = LanguageModel::Load(ModelDir(GetParam()), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const GoldenData g = ReadGolden(GetParam());
  const int V = (*model)->config().vocab_size;
  const ModelGeometry geo = (*model)->config().Geometry();
  Fp32StateStore sa(geo), sb(geo);
  ModelSession a(model->get(), &sa), b(model->get(), &sb);
  std::vector<int32_t> head(g.tokens.begin(), g.tokens.begin() + 40);
  std::vector<int32_t> tail(g.tokens.begin() + 40, g.tokens.end());
  std::vector<float> logits;
  ASSERT_TRUE(a.Forward(head, RecurrentMode::kPrefill, &logits).ok());
  const std::string aux = a.ExportAuxBytes();
  EXPECT_EQ(static_cast<int64_t>(aux.size()), a.ConvStateBytesPerLayer() * geo.layers);
  EXPECT_EQ(a.ConvStateBytesPerLayer(), int64_t{(*model)->config().ConvChannels()} * 3 * 4);
  ASSERT_TRUE(sb.WriteStates(*sa.ReadStates()).ok());
  ASSERT_TRUE(b.ImportAuxBytes(aux).ok());
  ASSERT_TRUE(b.Forward(tail, RecurrentMode::kDecode, &logits).ok());
  std::vector<float> ref(g.logits.begin() + 40 * V, g.logits.end());
  EXPECT_LE(MaxRel(logits, ref), 1e-4);

  // Without the conv windows the continuation is measurably wrong: the
  // auxiliary bytes matter.
  Fp32StateStore sc(geo);
  ModelSession c(model->get(), &sc);
  ASSERT_TRUE(sc.WriteStates(*sa.ReadStates()).ok());
  ASSERT_TRUE(c.Forward(tail, RecurrentMode::kDecode, &logits).ok());
  EXPECT_GT(MaxRel(logits, ref), 1e-3);

  // Per-layer round trip and errors.
  auto l1 = a.ExportConvState(1);
  ASSERT_TRUE(l1.ok());
  EXPECT_TRUE(c.ImportConvState(1, *l1).ok());
  EXPECT_EQ(*c.ExportConvState(1), *l1);
  EXPECT_EQ(c.ImportConvState(1, "abc").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ImportConvState(geo.layers, *l1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ExportConvState(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ImportAuxBytes(aux.substr(1)).code(), StatusCode::kInvalidArgument);
}

TEST_P(SessionTest, GoldenThroughCpuBackendFp32AndDamp) {
  auto model = LanguageModel::Load(ModelDir(GetParam()), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const GoldenData g = ReadGolden(GetParam());
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  const ModelGeometry geo = (*model)->config().Geometry();
  for (const char* fmt : {"fp32", "damp:16"}) {
    auto layout = StateLayout::Identity(geo, *ParseFormatSpec(fmt));
    ASSERT_TRUE(layout.ok()) << layout.status();
    auto store = BackendStateStore::Create(backend->get(), *layout);
    ASSERT_TRUE(store.ok()) << store.status();
    ModelSession s(model->get(), store->get());
    std::vector<float> logits;
    ASSERT_TRUE(s.Forward(g.tokens, RecurrentMode::kDecode, &logits).ok());
    const double rel = MaxRel(logits, g.logits);
    std::printf("%s %s decode: logits max-rel %.3g\n", GetParam().c_str(), fmt, rel);
    if (std::string(fmt) == "fp32") {
      EXPECT_LE(rel, 1e-4);
    } else {
      EXPECT_GT(rel, 1e-7) << "a quantized state changes the logits";
      EXPECT_LE(rel, 5e-2);
    }
  }
}

TEST_P(SessionTest, RejectsBadTokensAndMismatchedStores) {
  auto model = LanguageModel::Load(ModelDir(GetParam()), {});
  ASSERT_TRUE(model.ok());
  ModelGeometry other = (*model)->config().Geometry();
  other.layers = 3;
  Fp32StateStore wrong(other);
  ModelSession bad(model->get(), &wrong);
  std::vector<float> logits;
  EXPECT_EQ(bad.Forward({1, 2}, RecurrentMode::kDecode, &logits).code(),
            StatusCode::kInvalidArgument);
  Fp32StateStore store((*model)->config().Geometry());
  ModelSession s(model->get(), &store);
  EXPECT_EQ(s.Forward({1, 256}, RecurrentMode::kDecode, &logits).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Forward({-1}, RecurrentMode::kDecode, &logits).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Forward({}, RecurrentMode::kDecode, &logits).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.Forward({65, 66}, RecurrentMode::kDecode, nullptr).ok());
  EXPECT_EQ(s.position(), 2);
  ASSERT_TRUE(s.Reset().ok());
  EXPECT_EQ(s.position(), 0);
  EXPECT_EQ(*store.ReadStates(), std::vector<float>(StateElements(store.geometry()), 0.0f));
}

INSTANTIATE_TEST_SUITE_P(Models, SessionTest, ::testing::Values("gdn-tiny", "kda-tiny"),
                         [](const auto& info) { return info.param == "gdn-tiny" ? "gdn" : "kda"; });

}  // namespace
}  // namespace statecache
