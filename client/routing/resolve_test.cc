#include "client/routing/resolve.h"

#include "client/routing/hash_ring.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

TEST(ResolveEndpointsTest, LiteralAddresses) {
  auto v4 = ResolveEndpoints("127.0.0.1", 50051);
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(*v4, std::vector<std::string>{"127.0.0.1:50051"});
  auto v6 = ResolveEndpoints("::1", 7);
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(*v6, std::vector<std::string>{"[::1]:7"});
}

TEST(ResolveEndpointsTest, LocalhostBuildsARing) {
  auto eps = ResolveEndpoints("localhost", 50099);
  ASSERT_TRUE(eps.ok()) << eps.status();
  for (const std::string& e : *eps) {
    EXPECT_TRUE(e == "127.0.0.1:50099" || e == "[::1]:50099") << e;
  }
  auto ring = HashRing::Create(*eps);
  ASSERT_TRUE(ring.ok());
  EXPECT_FALSE(ring->Route("conv-1").empty());
}

TEST(ResolveEndpointsTest, BadInput) {
  EXPECT_EQ(ResolveEndpoints("", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveEndpoints("localhost", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveEndpoints("localhost", 65536).status().code(),
            absl::StatusCode::kInvalidArgument);
  // (No lookup of an unknown name: that would query the system's DNS server.)
}

}  // namespace
}  // namespace statecache
