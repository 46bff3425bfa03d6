#include "client/ctl/serve_bench_routing.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/routing/hash_ring.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Keys(int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(absl::StrCat("conversation-", i));
  return keys;
}

TEST(ConversationRouterTest, RingJoinMovesOnlyToTheNewInstance) {
  RouterOptions o;
  o.instances = 2;
  o.join_after = 10;
  absl::StatusOr<ConversationRouter> r = ConversationRouter::Create(Keys(200), o);
  ASSERT_TRUE(r.ok()) << r.status();
  int moved = 0;
  for (int c = 0; c < 200; ++c) {
    EXPECT_EQ(r->Route(0, c), 0);  // before the join: instance 0 alone
    EXPECT_EQ(r->Route(9, c), 0);
    const int after = r->Route(10, c);
    EXPECT_EQ(r->Route(1000, c), after);
    moved += after == 1;
  }
  EXPECT_EQ(r->moved(), moved);
  EXPECT_GT(moved, 60);  // about half of 200
  EXPECT_LT(moved, 140);
  EXPECT_THAT(r->Describe(), HasSubstr(absl::StrCat(moved, " of 200 conversations move")));
}

TEST(ConversationRouterTest, RingMatchesHashRing) {
  RouterOptions o;
  o.instances = 3;
  absl::StatusOr<ConversationRouter> r = ConversationRouter::Create(Keys(50), o);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<HashRing> ring =
      HashRing::Create({"statecached-0", "statecached-1", "statecached-2"});
  ASSERT_TRUE(ring.ok());
  for (int c = 0; c < 50; ++c) {
    EXPECT_EQ(r->Route(c, c), ring->RouteIndex(absl::StrCat("conversation-", c)));
  }
  EXPECT_EQ(r->moved(), 0);  // no join
}

TEST(ConversationRouterTest, ThreeInstancesJoinKeepsOthersInPlace) {
  RouterOptions o;
  o.instances = 3;
  o.join_after = 5;
  absl::StatusOr<ConversationRouter> r = ConversationRouter::Create(Keys(300), o);
  ASSERT_TRUE(r.ok());
  for (int c = 0; c < 300; ++c) {
    const int before = r->Route(0, c), after = r->Route(5, c);
    EXPECT_LT(before, 2);
    if (before != after) {
      EXPECT_EQ(after, 2) << c;  // keys move only to the joiner
    }
  }
}

TEST(ConversationRouterTest, RoundRobinHasNoAffinity) {
  RouterOptions o;
  o.instances = 2;
  o.mode = RouteMode::kRoundRobin;
  absl::StatusOr<ConversationRouter> r = ConversationRouter::Create(Keys(3), o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Route(0, 2), 0);
  EXPECT_EQ(r->Route(1, 2), 1);
  EXPECT_EQ(r->Route(7, 0), 1);
  EXPECT_EQ(r->moved(), 0);
  EXPECT_THAT(r->Describe(), HasSubstr("round robin over 2"));
}

TEST(ConversationRouterTest, OneInstanceRoutesEverythingToIt) {
  absl::StatusOr<ConversationRouter> r = ConversationRouter::Create(Keys(4), RouterOptions());
  ASSERT_TRUE(r.ok());
  for (int s = 0; s < 10; ++s) EXPECT_EQ(r->Route(s, s % 4), 0);
}

TEST(ConversationRouterTest, BadOptionsNameTheField) {
  RouterOptions o;
  o.instances = 9;
  EXPECT_THAT(ConversationRouter::Create(Keys(2), o).status().message(),
              HasSubstr("instances"));
  o.instances = 2;
  o.join_after = -1;
  EXPECT_THAT(ConversationRouter::Create(Keys(2), o).status().message(),
              HasSubstr("join_after"));
  EXPECT_THAT(ConversationRouter::Create({}, RouterOptions()).status().message(),
              HasSubstr("keys"));
}

TEST(ServeSetupsTest, Parses) {
  absl::StatusOr<std::vector<ServeSetup>> s = ParseServeSetups("1,1+host,2,redis+2");
  EXPECT_FALSE(s.ok());
  s = ParseServeSetups("1,1+host,2,2+redis,3+redis+host");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 5u);
  EXPECT_EQ((*s)[1].name, "1+host");
  EXPECT_TRUE((*s)[1].host);
  EXPECT_FALSE((*s)[1].redis);
  EXPECT_EQ((*s)[3].instances, 2);
  EXPECT_TRUE((*s)[3].redis);
  EXPECT_EQ((*s)[4].name, "3+host+redis");
  for (const char* bad : {"", "0", "9", "2+disk", "2+host+host", "1,,2"}) {
    absl::StatusOr<std::vector<ServeSetup>> b = ParseServeSetups(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_THAT(b.status().message(), HasSubstr("--setups")) << bad;
  }
}

TEST(StateGeometryTest, Qwen36) {
  absl::StatusOr<std::optional<ModelGeometry>> g = ParseStateGeometry("qwen3.6");
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_EQ((*g)->layers, 30);
  EXPECT_EQ((*g)->h_qk, 16);
  EXPECT_EQ((*g)->h_v, 32);
  EXPECT_TRUE((*g)->Validate().ok());
  EXPECT_EQ(int64_t{4} * (*g)->layers * (*g)->h_v * (*g)->d_k * (*g)->d_v, 62914560);  // 62.9 MB of fp32 per sequence
  EXPECT_EQ(ConvWindowBytesPerLayer(**g), 49152);
  g = ParseStateGeometry("model");
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->has_value());
  EXPECT_THAT(ParseStateGeometry("qwen3").status().message(), HasSubstr("--state_geometry"));
}

}  // namespace
}  // namespace statecache
