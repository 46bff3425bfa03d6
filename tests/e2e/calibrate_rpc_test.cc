// The Calibrate RPC end to end on loopback: synthetic trajectories streamed
// through StateCacheClient::Calibrate must give the layout the calibration
// library builds in process (same fingerprint and maps), a layout file that
// loads for the same geometry / format, a registered model, and exact errors
// for bad streams.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/statecache_client.h"
#include "kernels/calibration/build_layout.h"
#include "kernels/calibration/calibrator.h"
#include "kernels/layout/layout_file.h"
#include "kernels/trajectory/synthetic.h"
#include "kernels/trajectory/trajectory_file.h"
#include "server/core/log.h"
#include "server/core/proto_convert.h"
#include "server/loopback.h"
#include "server/server.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

ModelGeometry SmallGeometry(int h_v = 2) {
  ModelGeometry g;
  g.arch = Arch::kGdn;
  g.layers = 1;
  g.h_qk = 1;
  g.h_v = h_v;
  g.d_k = 64;
  g.d_v = 64;
  return g;
}

Trajectory Synthetic(const ModelGeometry& g, uint64_t seed, const std::string& domain) {
  SyntheticOptions o;
  o.geometry = g;
  o.tokens = 256;
  o.seed = seed;
  o.domain = domain;
  absl::StatusOr<Trajectory> t = MakeSyntheticTrajectory(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

std::string Bytes(const Trajectory& t) {
  absl::StatusOr<std::string> b = SerializeTrajectory(t);
  EXPECT_TRUE(b.ok()) << b.status();
  return *b;
}

class CalibrateRpcTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { SetLoggingEnabled(false); }

  void Start(int64_t max_calibration_bytes = int64_t{1} << 30) {
    StateCacheServer::Options options = LoopbackOptions(4 << 20, 2 << 20);
    options.limits.max_calibration_bytes = max_calibration_bytes;
    auto server = StateCacheServer::Create(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto client = StateCacheClient::Connect(LoopbackTarget(*server_));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    ASSERT_TRUE(client_->WaitForReady(absl::Seconds(5)).ok());
  }

  v1::CalibrateSettings Settings(const std::string& model_id = "") const {
    v1::CalibrateSettings s;
    *s.mutable_geometry() = GeometryToProto(geometry_);
    s.set_format("damp:16");
    s.set_model_id(model_id);
    s.set_slots(4);
    s.set_checkpoints(2);
    return s;
  }

  // Two "code" documents and one "prose" document (its domain given in the
  // message, overriding the file's).
  void MakeTrajectories() {
    trajectories_ = {Synthetic(geometry_, 1, "code"), Synthetic(geometry_, 2, "code"),
                     Synthetic(geometry_, 3, "synthetic")};
    streamed_ = {{Bytes(trajectories_[0]), ""},
                 {Bytes(trajectories_[1]), ""},
                 {Bytes(trajectories_[2]), "prose"}};
    trajectories_[2].domain = "prose";
  }

  const ModelGeometry geometry_ = SmallGeometry();
  std::vector<Trajectory> trajectories_;
  std::vector<CalibrationTrajectory> streamed_;
  std::unique_ptr<StateCacheServer> server_;
  std::unique_ptr<StateCacheClient> client_;
};

TEST_F(CalibrateRpcTest, MatchesInProcessCalibrationAndRegisters) {
  Start();
  MakeTrajectories();
  absl::StatusOr<v1::CalibrateResponse> resp =
      client_->Calibrate(Settings("calibrated"), streamed_);
  ASSERT_TRUE(resp.ok()) << resp.status();

  // The same library in process on the same trajectories.
  CalibrationOptions opts;
  opts.damp_sr = false;
  opts.prefetch = 0;
  absl::StatusOr<CalibrationStats> st = Calibrate(TrajectoriesFromVector(&trajectories_), opts);
  ASSERT_TRUE(st.ok()) << st.status();
  const FormatSpec spec = *ParseFormatSpec("damp:16");
  absl::StatusOr<BuiltLayout> built = BuildLayout(*st, {spec, DefaultSelector(spec.format)});
  ASSERT_TRUE(built.ok()) << built.status();

  EXPECT_EQ(resp->layout_fingerprint(), built->layout.Fingerprint());
  EXPECT_EQ(resp->selector(), "ep");
  EXPECT_EQ(resp->samples(), st->samples);
  EXPECT_EQ(resp->samples(), 3 * 256 / 8);
  EXPECT_EQ(resp->tokens(), 3 * 256);
  ASSERT_EQ(resp->domains_size(), 2);
  EXPECT_EQ(resp->domains(0).domain(), "code");
  EXPECT_EQ(resp->domains(0).trajectories(), 2);
  EXPECT_EQ(resp->domains(0).samples(), 64);
  EXPECT_EQ(resp->domains(1).domain(), "prose");
  EXPECT_EQ(resp->domains(1).trajectories(), 1);
  EXPECT_EQ(resp->domains(1).samples(), 32);
  // "code" has two documents: the split-half report exists.
  ASSERT_TRUE(resp->has_stability());
  EXPECT_EQ(resp->stability().top(), 16);
  absl::StatusOr<StabilityReport> stab = ComputeStability(*st, {spec, Selector::kErrorPersistence}, 16);
  ASSERT_TRUE(stab.ok()) << stab.status();
  EXPECT_DOUBLE_EQ(resp->stability().common(), stab->overall.common);

  // The layout file loads for the same geometry and format and holds the maps.
  absl::StatusOr<LayoutFile> file = ParseLayout(resp->layout_file(), &geometry_, &spec);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->layout.Fingerprint(), built->layout.Fingerprint());
  EXPECT_EQ(file->layout.all_key_perms(), built->layout.all_key_perms());
  EXPECT_EQ(file->info.at("selector"), "ep");
  const ModelGeometry other = SmallGeometry(4);
  EXPECT_EQ(ParseLayout(resp->layout_file(), &other, &spec).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Registered with that layout.
  ASSERT_TRUE(resp->has_model());
  EXPECT_EQ(resp->model().model_id(), "calibrated");
  EXPECT_EQ(resp->model().tags().layout_fingerprint(), built->layout.Fingerprint());
  EXPECT_FALSE(resp->model().identity_layout());
  EXPECT_EQ(resp->model().stats().slot_capacity(), 4);
  absl::StatusOr<v1::ModelInfo> described = client_->DescribeModel("calibrated");
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->tags().layout_fingerprint(), built->layout.Fingerprint());

  // The returned file also registers by upload; same id again is taken.
  ModelRegistration r;
  r.model_id = "uploaded";
  r.geometry = geometry_;
  r.format = "damp:16";
  r.layout_file = resp->layout_file();
  r.slots = 2;
  r.checkpoints = 1;
  absl::StatusOr<v1::ModelInfo> uploaded = client_->RegisterModel(r);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(uploaded->tags().layout_fingerprint(), built->layout.Fingerprint());
  EXPECT_EQ(client_->Calibrate(Settings("calibrated"), streamed_).status().code(),
            absl::StatusCode::kAlreadyExists);

  // Without model_id nothing is registered.
  absl::StatusOr<v1::CalibrateResponse> plain = client_->Calibrate(Settings(), streamed_);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->has_model());
  EXPECT_EQ(plain->layout_fingerprint(), built->layout.Fingerprint());
}

TEST_F(CalibrateRpcTest, BadStreamsAreInvalidArgumentNamingTheProblem) {
  Start();
  MakeTrajectories();
  auto expect_invalid = [&](const v1::CalibrateSettings& s,
                            const std::vector<CalibrationTrajectory>& t, const std::string& want) {
    absl::StatusOr<v1::CalibrateResponse> r = client_->Calibrate(s, t);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(want));
  };
  // Corrupt bytes: garbage, and a truncated file.
  expect_invalid(Settings(), {streamed_[0], {"not a safetensors file", ""}},
                 "message 1: trajectory_file");
  expect_invalid(Settings(), {streamed_[0], streamed_[1], {streamed_[2].file.substr(0, 200), ""}},
                 "message 2: trajectory_file");
  // Geometry mismatch.
  expect_invalid(Settings(),
                 {streamed_[0], {Bytes(Synthetic(SmallGeometry(4), 9, "code")), ""}},
                 "message 1: trajectory_file: geometry");
  // No trajectories.
  expect_invalid(Settings(), {}, "no trajectories");
  // Settings.
  v1::CalibrateSettings s = Settings();
  s.set_format("int8");
  expect_invalid(s, streamed_, "settings.format");
  s = Settings();
  s.set_selector("best");
  expect_invalid(s, streamed_, "settings.selector");
  s = Settings();
  s.mutable_geometry()->set_d_k(0);
  expect_invalid(s, streamed_, "settings.geometry");
  // Nothing was registered by the failures.
  absl::StatusOr<std::vector<v1::ModelInfo>> models = client_->ListModels();
  ASSERT_TRUE(models.ok());
  EXPECT_TRUE(models->empty());
}

TEST_F(CalibrateRpcTest, TotalBytesAreBounded) {
  MakeTrajectories();
  const int64_t one = static_cast<int64_t>(streamed_[0].file.size());
  Start(2 * one + one / 2);
  absl::StatusOr<v1::CalibrateResponse> r = client_->Calibrate(Settings(), streamed_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("max_calibration_bytes"));
  // Two files fit.
  EXPECT_TRUE(client_->Calibrate(Settings(), {streamed_[0], streamed_[2]}).ok());
}

}  // namespace
}  // namespace statecache
