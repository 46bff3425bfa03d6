#include "kernels/trajectory/trajectory_file.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/io/safetensors.h"
#include "kernels/trajectory/synthetic.h"

namespace statecache {
namespace {

using absl::StatusCode;

Trajectory SmallTrajectory(Arch arch) {
  SyntheticOptions o;
  o.geometry = ModelGeometry{arch, 2, 2, arch == Arch::kKda ? 2 : 4, 16, 32, 0.25f};
  o.tokens = 5;
  o.domain = "math";
  auto t = MakeSyntheticTrajectory(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

// Rebuilds a file image from `traj` with one edit applied to the writer.
template <typename Edit>
std::string EditedImage(const Trajectory& traj, Edit edit) {
  auto image = SerializeTrajectory(traj);
  EXPECT_TRUE(image.ok());
  auto file = SafetensorsFile::FromBytes(*image);
  EXPECT_TRUE(file.ok());
  SafetensorsWriter w;
  for (const auto& [k, v] : file->metadata()) w.SetMetadata(k, v);
  for (const std::string& name : file->names()) {
    auto t = file->tensor(name);
    EXPECT_TRUE(w.Add(name, t->dtype, t->shape, t->bytes).ok());
  }
  edit(w);
  return w.Serialize();
}

absl::Status ParseImage(std::string image) {
  auto file = SafetensorsFile::FromBytes(std::move(image));
  if (!file.ok()) return file.status();
  return TrajectoryFromSafetensors(*file).status();
}

TEST(TrajectoryFileTest, RoundTripGdnAndKda) {
  for (Arch arch : {Arch::kGdn, Arch::kKda}) {
    const Trajectory t = SmallTrajectory(arch);
    const std::string path = ::testing::TempDir() + "/traj.safetensors";
    ASSERT_TRUE(WriteTrajectoryFile(t, path).ok());
    auto r = ReadTrajectoryFile(path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->geometry, t.geometry);
    EXPECT_EQ(r->tokens, 5);
    EXPECT_EQ(r->domain, "math");
    EXPECT_EQ(r->source, "synthetic");
    ASSERT_EQ(r->layers.size(), 2u);
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(r->layers[l].q, t.layers[l].q);
      EXPECT_EQ(r->layers[l].k, t.layers[l].k);
      EXPECT_EQ(r->layers[l].v, t.layers[l].v);
      EXPECT_EQ(r->layers[l].g, t.layers[l].g);
      EXPECT_EQ(r->layers[l].beta, t.layers[l].beta);
    }
    std::remove(path.c_str());
  }
}

TEST(TrajectoryFileTest, MissingFileIsNotFound) {
  auto r = ReadTrajectoryFile(::testing::TempDir() + "/does-not-exist.safetensors");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

TEST(TrajectoryFileTest, MalformedMetadataIsInvalidArgumentNamingTheField) {
  const Trajectory t = SmallTrajectory(Arch::kGdn);
  struct Case {
    const char* key;
    const char* value;
    const char* want;
  } cases[] = {
      {"format", "other", "\"format\""},      {"version", "2", "\"version\""},
      {"arch", "mamba", "arch"},              {"layers", "two", "\"layers\""},
      {"h_v", "3", "h_v"},                    {"d_v", "48", "d_v"},
      {"scale", "x", "\"scale\""},            {"tokens", "0", "\"tokens\""},
      {"layers", "3", "layer2.q: missing"},   {"layers", "1", "layer1.beta: unexpected"},
      {"tokens", "6", "layer0.q"},            {"domain", "", "\"domain\""},
  };
  for (const Case& c : cases) {
    absl::Status s =
        ParseImage(EditedImage(t, [&](SafetensorsWriter& w) { w.SetMetadata(c.key, c.value); }));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.key << "=" << c.value;
    EXPECT_NE(s.message().find(c.want), absl::string_view::npos) << s.message();
  }
}

TEST(TrajectoryFileTest, MissingMetadataKeyIsInvalidArgument) {
  const Trajectory t = SmallTrajectory(Arch::kGdn);
  auto image = SerializeTrajectory(t);
  ASSERT_TRUE(image.ok());
  auto file = SafetensorsFile::FromBytes(*image);
  SafetensorsWriter w;
  for (const auto& [k, v] : file->metadata()) {
    if (k != "source") w.SetMetadata(k, v);
  }
  for (const std::string& name : file->names()) {
    auto tv = file->tensor(name);
    ASSERT_TRUE(w.Add(name, tv->dtype, tv->shape, tv->bytes).ok());
  }
  absl::Status s = ParseImage(w.Serialize());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("missing \"source\""), absl::string_view::npos) << s.message();
}

TEST(TrajectoryFileTest, BadValuesAreInvalidArgument) {
  Trajectory t = SmallTrajectory(Arch::kGdn);
  Trajectory bad_g = t;
  bad_g.layers[1].g[3] = 0.5f;
  Trajectory bad_beta = t;
  bad_beta.layers[0].beta[0] = 1.5f;
  Trajectory nan_v = t;
  nan_v.layers[0].v[7] = std::nanf("");
  for (const auto& [traj, want] : std::vector<std::pair<Trajectory, std::string>>{
           {bad_g, "layer1.g: element 3"},
           {bad_beta, "layer0.beta: element 0"},
           {nan_v, "layer0.v: element 7"}}) {
    auto image = SerializeTrajectory(traj);
    ASSERT_TRUE(image.ok());
    absl::Status s = ParseImage(*image);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(want), absl::string_view::npos) << s.message();
  }
}

TEST(TrajectoryFileTest, IntegerTensorIsInvalidArgument) {
  const Trajectory t = SmallTrajectory(Arch::kGdn);
  // Replace layer0.beta by an I32 tensor of the right shape.
  auto image = SerializeTrajectory(t);
  auto file = SafetensorsFile::FromBytes(*image);
  SafetensorsWriter w;
  for (const auto& [k, v] : file->metadata()) w.SetMetadata(k, v);
  for (const std::string& name : file->names()) {
    auto tv = file->tensor(name);
    if (name == "layer0.beta") {
      std::vector<int32_t> ints(tv->num_elements(), 0);
      ASSERT_TRUE(w.AddInt32(name, tv->shape, ints).ok());
    } else {
      ASSERT_TRUE(w.Add(name, tv->dtype, tv->shape, tv->bytes).ok());
    }
  }
  absl::Status s = ParseImage(w.Serialize());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer0.beta"), absl::string_view::npos) << s.message();
}

TEST(TrajectoryFileTest, SerializeRejectsInvalidTrajectory) {
  Trajectory t = SmallTrajectory(Arch::kGdn);
  t.layers[1].k.pop_back();
  EXPECT_EQ(SerializeTrajectory(t).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace statecache
