// Golden test: both shipped models against golden.safetensors (PyTorch FP32
// compute from the bf16 weights, FP32 states).
//
// Norm used everywhere: rel = max_i |ours_i - ref_i| / max_i |ref_i| over the
// whole tensor (a max-norm relative error). Logits must be within 1e-4 of
// that; the per-layer recurrent inputs and final states too.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "client/model/fp32_state_store.h"
#include "client/model/model.h"
#include "gtest/gtest.h"
#include "kernels/io/safetensors.h"
#include "kernels/io/test_data.h"

namespace statecache {
namespace {

double MaxRel(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double diff = 0, mag = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    diff = std::max(diff, std::fabs(double{got[i]} - ref[i]));
    mag = std::max(mag, std::fabs(double{ref[i]}));
  }
  return mag > 0 ? diff / mag : diff;
}

struct Golden {
  std::unique_ptr<LanguageModel> model;
  SafetensorsFile golden;
};

class GoldenTest : public ::testing::TestWithParam<std::string> {};

void CheckModel(const std::string& name, RecurrentMode mode, bool token_by_token) {
  auto dir = SharedDataPath("models/" + name);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto model = LanguageModel::Load(*dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  auto golden = SafetensorsFile::Open(*dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  auto tok64 = golden->ToInt64("tokens");
  ASSERT_TRUE(tok64.ok());
  std::vector<int32_t> tokens(tok64->begin(), tok64->end());
  const int T = static_cast<int>(tokens.size());
  const ModelConfig& c = (*model)->config();
  const ModelGeometry geo = c.Geometry();

  Fp32StateStore store(geo, (*model)->pool());
  ModelSession session(model->get(), &store);
  std::vector<float> logits;
  ForwardTrace trace;
  if (!token_by_token) {
    ASSERT_TRUE(session.Forward(tokens, mode, &logits, &trace).ok());
  } else {
    trace.layers.assign(c.num_layers, ForwardTrace::Layer());
    for (int t = 0; t < T; ++t) {
      std::vector<float> step_logits;
      ForwardTrace step;
      auto st = session.Forward({tokens[t]}, mode, &step_logits, &step);
      ASSERT_TRUE(st.ok()) << st;
      logits.insert(logits.end(), step_logits.begin(), step_logits.end());
      for (int l = 0; l < c.num_layers; ++l) {
        auto& dst = trace.layers[l];
        auto& src = step.layers[l];
        dst.q.insert(dst.q.end(), src.q.begin(), src.q.end());
        dst.k.insert(dst.k.end(), src.k.begin(), src.k.end());
        dst.v.insert(dst.v.end(), src.v.begin(), src.v.end());
        dst.g.insert(dst.g.end(), src.g.begin(), src.g.end());
        dst.beta.insert(dst.beta.end(), src.beta.begin(), src.beta.end());
      }
    }
  }
  EXPECT_EQ(session.position(), T);
  auto ref_logits = golden->ToFloat32("logits", {T, c.vocab_size});
  ASSERT_TRUE(ref_logits.ok());
  const double logit_rel = MaxRel(logits, *ref_logits);
  std::printf("%s %s%s: logits max-rel %.3g\n", name.c_str(),
              mode == RecurrentMode::kDecode ? "decode" : "prefill",
              token_by_token ? " token-by-token" : " one chunk", logit_rel);
  EXPECT_LE(logit_rel, 1e-4);

  auto states = store.ReadStates();
  ASSERT_TRUE(states.ok());
  const int64_t per_layer = int64_t{geo.h_v} * geo.d_k * geo.d_v;
  double worst_input = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    const auto& tr = trace.layers[l];
    struct Item {
      const char* field;
      const std::vector<float>* got;
    } items[] = {{"q", &tr.q}, {"k", &tr.k}, {"v", &tr.v}, {"g", &tr.g}, {"beta", &tr.beta}};
    for (const Item& it : items) {
      auto ref = golden->ToFloat32(p + it.field);
      ASSERT_TRUE(ref.ok()) << ref.status();
      const double rel = MaxRel(*it.got, *ref);
      worst_input = std::max(worst_input, rel);
      EXPECT_LE(rel, 1e-4) << name << " " << p << it.field;
    }
    std::vector<float> fs(states->begin() + l * per_layer, states->begin() + (l + 1) * per_layer);
    auto ref_fs = golden->ToFloat32(p + "final_state", {geo.h_v, geo.d_k, geo.d_v});
    ASSERT_TRUE(ref_fs.ok());
    const double rel = MaxRel(fs, *ref_fs);
    std::printf("  layer %d final_state max-rel %.3g\n", l, rel);
    EXPECT_LE(rel, 1e-4) << name << " " << p << "final_state";
  }
  std::printf("  worst q/k/v/g/beta max-rel over layers %.3g\n", worst_input);
}

TEST_P(GoldenTest, PrefillOneChunk) { CheckModel(GetParam(), RecurrentMode::kPrefill, false); }
TEST_P(GoldenTest, DecodeOneChunk) { CheckModel(GetParam(), RecurrentMode::kDecode, false); }
TEST_P(GoldenTest, DecodeTokenByToken) { CheckModel(GetParam(), RecurrentMode::kDecode, true); }

INSTANTIATE_TEST_SUITE_P(Models, GoldenTest, ::testing::Values("gdn-tiny", "kda-tiny"));

}  // namespace
}  // namespace statecache
