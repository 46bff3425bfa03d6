#include "client/cpp/sharded_client.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/remote_store/child_server.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

constexpr int kServers = 3;

// Rows of client/routing/testdata/ring_vectors.tsv (the Python ring's
// output), split on tabs, comments dropped.
std::vector<std::vector<std::string>> ReadVectors() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  std::ifstream f(absl::StrCat(srcdir ? srcdir : ".",
                               "/statecache/client/routing/testdata/ring_vectors.tsv"));
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    rows.push_back(absl::StrSplit(line, '\t'));
  }
  return rows;
}

// Three statecached children; server i holds a model named "server-<i>" (so
// a client can tell which server it talks to) and a small model "m".
class ShardedClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (int i = 0; i < kServers; ++i) {
      auto server = StartCpuChild(4194304, 4194304);
      ASSERT_TRUE(server.ok()) << server.status();
      auto client = StateCacheClient::Connect((*server)->address());
      ASSERT_TRUE(client.ok()) << client.status();
      for (const std::string id : {absl::StrCat("server-", i), std::string("m")}) {
        ModelRegistration r;
        r.model_id = id;
        r.geometry = ModelGeometry{Arch::kGdn, 1, 1, 1, 32, 32};
        r.format = "int8";
        r.slots = 4;
        r.checkpoints = 64;
        auto info = (*client)->RegisterModel(r);
        ASSERT_TRUE(info.ok()) << info.status();
      }
      servers_.push_back(server->release());
    }
  }
  static void TearDownTestSuite() {
    for (ChildServer* s : servers_) delete s;
    servers_.clear();
  }

  void SetUp() override { ASSERT_EQ(servers_.size(), static_cast<size_t>(kServers)); }

  static std::vector<std::string> Addresses() {
    std::vector<std::string> out;
    for (ChildServer* s : servers_) out.push_back(s->address());
    return out;
  }

  // Which server (0..kServers-1) `client` is connected to, from the
  // "server-<i>" model it lists; -1 when none.
  static int ServerOf(StateCacheClient& client) {
    auto models = client.ListModels();
    EXPECT_TRUE(models.ok()) << models.status();
    if (!models.ok()) return -1;
    for (const v1::ModelInfo& m : *models) {
      int i = 0;
      if (absl::StartsWith(m.model_id(), "server-") &&
          absl::SimpleAtoi(m.model_id().substr(7), &i)) {
        return i;
      }
    }
    return -1;
  }

  static std::vector<ChildServer*> servers_;
};

std::vector<ChildServer*> ShardedClientTest::servers_;

// Every ring of the shared vectors, with its endpoint names dialled as the
// real servers (ring endpoint j -> server j % 3): each vector's key reaches
// the server that the Python ring's endpoint maps to, and EndpointFor is the
// Python ring's endpoint name itself.
TEST_F(ShardedClientTest, RoutesTheSharedVectorsToTheSameEndpointAsPython) {
  std::map<std::string, std::unique_ptr<ShardedStateCacheClient>> rings;
  std::map<std::string, std::map<std::string, int>> server_of_endpoint;
  int routes = 0;
  for (const auto& row : ReadVectors()) {
    if (row[0] == "ring") {
      ASSERT_EQ(row.size(), 4u);
      ShardedStateCacheClient::Options options;
      ASSERT_TRUE(absl::SimpleAtoi(row[2], &options.virtual_nodes)) << row[2];
      std::vector<std::string> endpoints = absl::StrSplit(row[3], ',');
      for (size_t j = 0; j < endpoints.size(); ++j) {
        options.targets[endpoints[j]] = servers_[j % kServers]->address();
        server_of_endpoint[row[1]][endpoints[j]] = j % kServers;
      }
      auto sharded = ShardedStateCacheClient::Create(endpoints, options);
      ASSERT_TRUE(sharded.ok()) << sharded.status();
      EXPECT_EQ((*sharded)->endpoints(), endpoints);
      rings[row[1]] = std::move(*sharded);
    } else if (row[0] == "route") {
      ASSERT_EQ(row.size(), 4u);
      auto it = rings.find(row[1]);
      ASSERT_NE(it, rings.end()) << row[1];
      const std::string& key = row[2];
      const std::string& want = row[3];
      EXPECT_EQ(it->second->EndpointFor(key), want) << "ring " << row[1] << " key '" << key << "'";
      auto client = it->second->ForConversation(key);
      ASSERT_TRUE(client.ok()) << client.status();
      EXPECT_EQ(ServerOf(**client), server_of_endpoint[row[1]].at(want))
          << "ring " << row[1] << " key '" << key << "'";
      ++routes;
    }
  }
  EXPECT_EQ(rings.size(), 3u);
  EXPECT_GT(routes, 300);
}

// A conversation's checkpoint is written through ForConversation and found
// again through it later, on its own server only.
TEST_F(ShardedClientTest, SnapshotIsFoundAgainThroughTheSameShardedClient) {
  auto sharded = ShardedStateCacheClient::Create(Addresses(), {});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  std::map<int, int> per_server;
  for (int c = 0; c < 12; ++c) {
    const std::string conv = absl::StrCat("snapshot-conversation-", c);
    const std::vector<int32_t> tokens = {c, c + 1, c + 2, 7};
    auto client = (*sharded)->ForConversation(conv);
    ASSERT_TRUE(client.ok()) << client.status();
    auto slots = (*client)->AllocateSlots("m", 1);
    ASSERT_TRUE(slots.ok()) << slots.status();
    std::vector<float> states(32 * 32, 0.25f * (c + 1));
    ASSERT_TRUE((*client)->PrefillStates("m", *slots, states).ok());
    auto key = (*client)->Snapshot("m", (*slots)[0], tokens);
    ASSERT_TRUE(key.ok()) << key.status();
    ASSERT_TRUE((*client)->ReleaseSlots("m", *slots).ok());

    auto again = (*sharded)->ForConversation(conv);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->get(), client->get());  // one client per endpoint
    auto hit = (*again)->LookupPrefix("m", tokens);
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_TRUE(hit->hit) << conv;
    EXPECT_EQ(hit->key, *key);
    EXPECT_EQ(hit->candidate_tokens, 4);
    const int owner = ServerOf(**again);
    EXPECT_EQ(servers_[owner]->address(), (*sharded)->EndpointFor(conv));
    ++per_server[owner];
    for (int s = 0; s < kServers; ++s) {
      if (s == owner) continue;
      auto other = (*sharded)->ForEndpoint(servers_[s]->address());
      ASSERT_TRUE(other.ok());
      auto miss = (*other)->LookupPrefix("m", tokens);
      ASSERT_TRUE(miss.ok()) << miss.status();
      EXPECT_FALSE(miss->hit) << conv << " also on server " << s;
    }
  }
  EXPECT_GE(per_server.size(), 2u);  // spread over servers
}

// Removing an endpoint moves exactly its conversations; the others stay (and
// still reach their server); adding it back restores the old routing.
TEST_F(ShardedClientTest, RemovingAnEndpointMovesOnlyItsConversations) {
  const std::vector<std::string> addresses = Addresses();
  auto sharded = ShardedStateCacheClient::Create(addresses, {});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  std::vector<std::string> before;
  for (int c = 0; c < 300; ++c) before.push_back((*sharded)->EndpointFor(absl::StrCat("conv-", c)));
  auto old_client = (*sharded)->ForEndpoint(addresses[1]);
  ASSERT_TRUE(old_client.ok());

  ASSERT_TRUE((*sharded)->RemoveEndpoint(addresses[1]).ok());
  EXPECT_EQ((*sharded)->endpoints(), (std::vector<std::string>{addresses[0], addresses[2]}));
  EXPECT_EQ((*sharded)->ForEndpoint(addresses[1]).status().code(), absl::StatusCode::kNotFound);
  int moved = 0;
  for (int c = 0; c < 300; ++c) {
    const std::string conv = absl::StrCat("conv-", c);
    const std::string after = (*sharded)->EndpointFor(conv);
    if (before[c] == addresses[1]) {
      EXPECT_NE(after, addresses[1]) << conv;
      ++moved;
    } else {
      EXPECT_EQ(after, before[c]) << conv;
    }
    if (c % 25 == 0) {
      auto client = (*sharded)->ForConversation(conv);
      ASSERT_TRUE(client.ok());
      EXPECT_EQ(servers_[ServerOf(**client)]->address(), after) << conv;
    }
  }
  EXPECT_GT(moved, 50);   // ~1/3 of 300
  EXPECT_LT(moved, 150);
  // A client handed out before the removal stays usable.
  EXPECT_EQ(ServerOf(**old_client), 1);

  ASSERT_TRUE((*sharded)->AddEndpoint(addresses[1]).ok());
  for (int c = 0; c < 300; ++c) {
    EXPECT_EQ((*sharded)->EndpointFor(absl::StrCat("conv-", c)), before[c]);
  }
}

TEST_F(ShardedClientTest, Errors) {
  auto empty = ShardedStateCacheClient::Create({}, {});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto dup = ShardedStateCacheClient::Create({"a:1", "a:1"}, {});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  ShardedStateCacheClient::Options bad_vnodes;
  bad_vnodes.virtual_nodes = 0;
  EXPECT_EQ(ShardedStateCacheClient::Create({"a:1"}, bad_vnodes).status().code(),
            absl::StatusCode::kInvalidArgument);
  ShardedStateCacheClient::Options bad_target;
  bad_target.targets["a:1"] = "";
  auto t = ShardedStateCacheClient::Create({"a:1"}, bad_target);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("targets"), std::string::npos) << t.status();

  auto one = ShardedStateCacheClient::Create({"a:1"}, {});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)->RemoveEndpoint("a:1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*one)->RemoveEndpoint("b:1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*one)->AddEndpoint("a:1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*one)->TargetOf("a:1"), "a:1");

  EXPECT_EQ(ShardedStateCacheClient::FromDns("", 50051, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardedStateCacheClient::FromDns("localhost", 0, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto local = ShardedStateCacheClient::FromDns("localhost", 50051, {});
  ASSERT_TRUE(local.ok()) << local.status();
  for (const std::string& e : (*local)->endpoints()) {
    EXPECT_TRUE(absl::EndsWith(e, ":50051")) << e;
  }
}

}  // namespace
}  // namespace statecache
