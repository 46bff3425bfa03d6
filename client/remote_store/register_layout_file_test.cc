// RegisterModel with a layout file (RegisterModelRequest.layout_file): the
// server parses the checksummed file, checks it against the request's
// geometry and format, and registers exactly its maps (same fingerprint as
// the layout in process). Against a statecached child, CPU backend.
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "client/cpp/statecache_client.h"
#include "client/remote_store/child_server.h"
#include "client/remote_store/remote_state_store.h"
#include "kernels/layout/layout_file.h"

namespace statecache {
namespace {

using ::absl::StatusCode;
using ::testing::HasSubstr;

ModelGeometry Geo() {
  return ModelGeometry{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
}

StateLayout Permuted(const std::string& format) {
  const ModelGeometry g = Geo();
  const FormatSpec spec = ParseFormatSpec(format).value();
  std::mt19937 rng(11);
  std::vector<int32_t> perm, order;
  std::vector<float> scale;
  for (int h = 0; h < g.layers * g.h_v; ++h) {
    std::vector<int32_t> p(g.d_k), o(g.d_v);
    std::iota(p.begin(), p.end(), 0);
    std::iota(o.begin(), o.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    std::shuffle(o.begin(), o.end(), rng);
    perm.insert(perm.end(), p.begin(), p.end());
    if (spec.format == StateFormat::kDampSr) {
      order.insert(order.end(), o.begin(), o.end());
      for (int j = 0; j < g.d_v; ++j) scale.push_back(0.5f + 0.03f * j);
    }
  }
  return StateLayout::Create(g, spec, perm, order, scale).value();
}

class RegisterLayoutFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto bin = FindStatecached("");
    ASSERT_TRUE(bin.ok()) << bin.status();
    ChildServer::Options o;
    o.binary = *bin;
    o.args = {"--backend=cpu", "--state_memory_bytes=4194304", "--checkpoint_memory_bytes=1048576"};
    auto server = ChildServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    client_ = std::move(*StateCacheClient::Connect(server_->address()));
  }

  absl::StatusOr<v1::ModelInfo> Register(const std::string& id, const std::string& format,
                                         std::string file) {
    ModelRegistration r;
    r.model_id = id;
    r.geometry = Geo();
    r.format = format;
    r.layout_file = std::move(file);
    r.slots = 1;
    r.checkpoints = 1;
    return client_->RegisterModel(r);
  }

  std::unique_ptr<ChildServer> server_;
  std::unique_ptr<StateCacheClient> client_;
};

TEST_F(RegisterLayoutFileTest, RegistersTheFilesMaps) {
  for (const std::string format : {"damp:16", "damp-sr:8"}) {
    SCOPED_TRACE(format);
    const StateLayout layout = Permuted(format);
    auto bytes = SerializeLayout(layout, {{"selector", "test"}}, {});
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    const std::string id = format == "damp:16" ? "a" : "b";
    auto info = Register(id, format, *bytes);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->tags().layout_fingerprint(), layout.Fingerprint());
    EXPECT_FALSE(info->identity_layout());
    // A worker holding the same layout can attach (fingerprint checked).
    RemoteStateStore::Options o;
    o.layout = layout;
    EXPECT_TRUE(RemoteStateStore::Create(client_.get(), id, o).ok());
  }
}

TEST_F(RegisterLayoutFileTest, Errors) {
  const StateLayout layout = Permuted("damp:16");
  const std::string bytes = SerializeLayout(layout, {}, {}).value();
  // A flipped bit in the tensor bytes (the end of the file).
  std::string flipped = bytes;
  flipped[flipped.size() - 3] ^= 0x10;
  auto corrupt = Register("c", "damp:16", flipped);
  EXPECT_EQ(corrupt.status().code(), StatusCode::kDataLoss) << corrupt.status();
  EXPECT_THAT(std::string(corrupt.status().message()), HasSubstr("layout_file"));
  // The file is for damp:16, the request says damp:32.
  auto wrong_format = Register("c", "damp:32", bytes);
  EXPECT_EQ(wrong_format.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong_format.status().message()), HasSubstr("layout_file"));
  // Other geometry.
  ModelRegistration r;
  r.model_id = "c";
  r.geometry = Geo();
  r.geometry.layers = 3;
  r.format = "damp:16";
  r.layout_file = bytes;
  r.slots = 1;
  EXPECT_EQ(client_->RegisterModel(r).status().code(), StatusCode::kInvalidArgument);
  // Maps and file together.
  r.geometry = Geo();
  r.key_perm = layout.all_key_perms();
  auto both = client_->RegisterModel(r);
  EXPECT_EQ(both.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(both.status().message()), HasSubstr("not both"));
  // Not a layout file at all.
  EXPECT_EQ(Register("c", "damp:16", "garbage").status().code(), StatusCode::kInvalidArgument);
  // Nothing was registered by the failures.
  auto models = client_->ListModels();
  ASSERT_TRUE(models.ok());
  EXPECT_TRUE(models->empty());
}

}  // namespace
}  // namespace statecache
