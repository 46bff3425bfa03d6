#include "server/auth/tenants.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

using absl::StatusCode;

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("test"), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
}

constexpr char kFile[] = R"(# two tenants
tenant a max_slots=4 max_checkpoint_bytes=1000 requests_per_second=2 burst=3
token a sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  # "test"
tenant b
token b sha256:)";

TEST(TenantDirectoryTest, ParsesAndAuthenticatesByDigest) {
  const std::string text = std::string(kFile) + Sha256Hex("b-secret") + "\n";
  auto dir = TenantDirectory::Parse(text, "tenants");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ((*dir)->token_count(), 2);
  auto a = (*dir)->Authenticate("test");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->name(), "a");
  EXPECT_EQ((*a)->quota().max_slots, 4);
  EXPECT_EQ((*a)->quota().max_checkpoint_bytes, 1000);
  EXPECT_EQ((*a)->quota().burst, 3);
  auto b = (*dir)->Authenticate("b-secret");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->name(), "b");
  EXPECT_EQ((*b)->quota().max_slots, 0);
  auto bad = (*dir)->Authenticate("nope");
  EXPECT_EQ(bad.status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(bad.status().message().find("nope"), absl::string_view::npos);
  // The raw token is not a digest: passing the digest itself fails.
  EXPECT_EQ((*dir)->Authenticate(Sha256Hex("test")).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ((*dir)->Authenticate("").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ((*dir)->Find("b"), *b);
  EXPECT_EQ((*dir)->Find("c"), nullptr);
}

TEST(TenantDirectoryTest, RejectsBadFilesNamingLine) {
  struct Case {
    const char* text;
    const char* want;
  };
  const Case cases[] = {
      {"token a sha256:00\n", "tenants:1: token: tenant 'a' is not declared above"},
      {"tenant a\ntoken a test\n", "tenants:2: token: digest must be sha256:"},
      {"tenant a\ntoken a "
       "sha256:9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08\n",
       "tenants:2: token: digest must be"},
      {"tenant a/b\n", "tenants:1: tenant: name must match"},
      {"tenant a max_slots=-1\n", "tenants:1: max_slots: '-1'"},
      {"tenant a speed=3\n", "tenants:1: unknown quota 'speed'"},
      {"tenant a\ntenant a\n", "tenants:2: tenant 'a' declared twice"},
      {"user a\n", "tenants:1: unknown directive 'user'"},
      {"tenant a\n", "tenants: no token lines"},
  };
  for (const Case& c : cases) {
    auto dir = TenantDirectory::Parse(c.text, "tenants");
    EXPECT_EQ(dir.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(absl::StartsWith(dir.status().message(), c.want))
        << c.text << " -> " << dir.status();
  }
  const std::string d = Sha256Hex("x");
  auto twice = TenantDirectory::Parse(
      "tenant a\ntenant b\ntoken a sha256:" + d + "\ntoken b sha256:" + d + "\n", "f");
  EXPECT_EQ(twice.status().message(), "f:4: token: digest listed twice");
}

TEST(TenantTest, RateBucketRefills) {
  TenantQuota q;
  q.requests_per_second = 10;
  q.burst = 2;
  Tenant t("a", q);
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(t.Admit(t0).ok());
  EXPECT_TRUE(t.Admit(t0).ok());
  absl::Status s = t.Admit(t0);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(s.message(), "quota requests_per_second: tenant 'a'")) << s;
  EXPECT_TRUE(t.Admit(t0 + absl::Milliseconds(150)).ok());  // 1.5 tokens refilled
  EXPECT_EQ(t.Admit(t0 + absl::Milliseconds(150)).code(), StatusCode::kResourceExhausted);
  Tenant unlimited("u", TenantQuota());
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(unlimited.Admit(t0).ok());
}

TEST(ParseBearerTest, Forms) {
  EXPECT_EQ(*ParseBearer("Bearer abc"), "abc");
  EXPECT_EQ(*ParseBearer("bearer   abc "), "abc");
  EXPECT_EQ(ParseBearer("Basic abc").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(ParseBearer("Bearer ").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(ParseBearer("").status().code(), StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace statecache
