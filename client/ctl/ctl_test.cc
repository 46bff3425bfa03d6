// statecachectl subcommands against a real in-process server.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "client/ctl/ctl_command.h"
#include "server/core/log.h"
#include "server/loopback.h"
#include "server/server.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

class CtlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLoggingEnabled(false);
    StateCacheServer::Options options = LoopbackOptions(1 << 20, 1 << 19);
    server_ = StateCacheServer::Create(std::move(options)).value();
  }

  // Runs `command` and returns (status, stdout).
  std::pair<absl::Status, std::string> Run(const Command& command,
                                           const std::vector<std::string>& args) {
    std::FILE* out = std::tmpfile();
    CtlContext ctx(LoopbackTarget(*server_), absl::Seconds(5), out);
    absl::Status status = command.run(ctx, args);
    std::fflush(out);
    std::rewind(out);
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), out)) > 0) text.append(buf, n);
    std::fclose(out);
    return {status, text};
  }

  std::unique_ptr<StateCacheServer> server_;
};

TEST_F(CtlTest, StatusAndModels) {
  auto [status, text] = Run(StatusCommand(), {});
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(text, HasSubstr("SERVING"));
  EXPECT_THAT(text, HasSubstr("backend      cpu"));
  EXPECT_THAT(text, HasSubstr("models       0"));
  auto [s2, none] = Run(ModelsCommand(), {});
  ASSERT_TRUE(s2.ok());
  EXPECT_THAT(none, HasSubstr("no models registered"));

  ModelRegistration r;
  r.model_id = "tiny";
  r.geometry = ModelGeometry{Arch::kGdn, 2, 1, 2, 32, 32};
  r.format = "damp:8";
  r.slots = 4;
  r.checkpoints = 2;
  auto client = StateCacheClient::Connect(LoopbackTarget(*server_)).value();
  ASSERT_TRUE(client->RegisterModel(r).ok());
  ASSERT_TRUE(client->AllocateSlots("tiny", 3).ok());

  auto [s3, models] = Run(ModelsCommand(), {});
  ASSERT_TRUE(s3.ok()) << s3;
  EXPECT_THAT(models, HasSubstr("tiny"));
  EXPECT_THAT(models, HasSubstr("damp:8"));
  EXPECT_THAT(models, HasSubstr("gdn L=2 Hqk=1 Hv=2 32x32"));
  EXPECT_THAT(models, HasSubstr("3/4"));
  EXPECT_THAT(models, HasSubstr("identity"));
  auto [s4, stat] = Run(StatusCommand(), {});
  ASSERT_TRUE(s4.ok());
  EXPECT_THAT(stat, HasSubstr("models       1"));
  EXPECT_THAT(stat, HasSubstr("3/4"));

  EXPECT_EQ(Run(ModelsCommand(), {"nope"}).first.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Run(StatusCommand(), {"extra"}).first.code(), absl::StatusCode::kInvalidArgument);
}

// unpack writes the slot's / the checkpoint's FP32 states to --out; the
// checkpoint keeps the states of snapshot time.
TEST_F(CtlTest, UnpackWritesSlotAndCheckpointStates) {
  ModelRegistration r;
  r.model_id = "f";
  r.geometry = ModelGeometry{Arch::kGdn, 1, 1, 1, 32, 32};
  r.format = "fp32";
  r.slots = 1;
  r.checkpoints = 1;
  auto client = StateCacheClient::Connect(LoopbackTarget(*server_)).value();
  ASSERT_TRUE(client->RegisterModel(r).ok());
  const SlotHandle slot = client->AllocateSlots("f", 1).value()[0];
  std::vector<float> states(32 * 32);
  for (size_t i = 0; i < states.size(); ++i) states[i] = 0.25f * static_cast<float>(i % 13) - 1;
  ASSERT_TRUE(client->PrefillStates("f", {slot}, states).ok());
  ASSERT_TRUE(client->Snapshot("f", slot, {5, 6, 7}, {}, PrefixKeyKind::kSha256).ok());
  ASSERT_TRUE(client->PrefillStates("f", {slot}, std::vector<float>(32 * 32, 0.5f)).ok());
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  auto file_floats = [](const std::string& path) {
    auto bytes = ReadFileBytes(path, "--out").value();
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
    return v;
  };
  auto [s1, t1] = Run(UnpackCommand(), {"f", "--tokens=5,6,7", "--key_kind=sha256",
                                        "--out=" + dir + "/ckpt.f32"});
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_THAT(t1, HasSubstr("unpacked checkpoint sha256:"));
  EXPECT_THAT(t1, HasSubstr("1024 float32 values"));
  EXPECT_EQ(file_floats(dir + "/ckpt.f32"), states);
  auto [s2, t2] = Run(UnpackCommand(), {"f", slot.DebugString(), "--out=" + dir + "/slot.f32"});
  ASSERT_TRUE(s2.ok()) << s2;
  EXPECT_EQ(file_floats(dir + "/slot.f32"), std::vector<float>(32 * 32, 0.5f));
  EXPECT_EQ(Run(UnpackCommand(), {"f", "--tokens=5,6", "--out=" + dir + "/x"}).first.code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Run(UnpackCommand(), {"f", "--tokens=5,6,7"}).first.code(),
            absl::StatusCode::kInvalidArgument);  // no --out
  EXPECT_EQ(Run(UnpackCommand(), {"f", slot.DebugString(), "--lease=1", "--out=/dev/null"})
                .first.code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CtlUnreachableTest, StatusReportsUnavailable) {
  std::FILE* out = std::tmpfile();
  CtlContext ctx("127.0.0.1:1", absl::Milliseconds(200), out);
  EXPECT_EQ(StatusCommand().run(ctx, {}).code(), absl::StatusCode::kUnavailable);
  std::fclose(out);
}

}  // namespace
}  // namespace statecache
