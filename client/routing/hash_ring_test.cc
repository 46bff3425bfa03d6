#include "client/routing/hash_ring.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

// Lines of testdata/ring_vectors.tsv split on tabs (comments dropped).
std::vector<std::vector<std::string>> ReadVectors() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string path =
      absl::StrCat(srcdir ? srcdir : ".", "/statecache/client/routing/testdata/ring_vectors.tsv");
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    rows.push_back(absl::StrSplit(line, '\t'));
  }
  return rows;
}

uint64_t Hex(const std::string& s) {
  uint64_t v = 0;
  EXPECT_TRUE(absl::SimpleHexAtoi(s, &v)) << s;
  return v;
}

TEST(RingHashTest, MatchesSharedVectors) {
  int fnv = 0, hashes = 0;
  for (const auto& row : ReadVectors()) {
    if (row[0] == "fnv1a64") {
      ASSERT_EQ(row.size(), 3u);
      EXPECT_EQ(Fnv1a64(row[1]), Hex(row[2])) << "key '" << row[1] << "'";
      ++fnv;
    } else if (row[0] == "hash64") {
      ASSERT_EQ(row.size(), 3u);
      EXPECT_EQ(RingHash64(row[1]), Hex(row[2])) << "key '" << row[1] << "'";
      ++hashes;
    }
  }
  EXPECT_EQ(fnv, 3);
  EXPECT_GE(hashes, 9);
}

TEST(RingHashTest, PublishedFnvValues) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(HashRingTest, RoutesLikeThePythonRing) {
  std::map<std::string, HashRing> rings;
  int routes = 0;
  for (const auto& row : ReadVectors()) {
    if (row[0] == "ring") {
      ASSERT_EQ(row.size(), 4u);
      int vnodes = 0;
      ASSERT_TRUE(absl::SimpleAtoi(row[2], &vnodes));
      std::vector<std::string> endpoints = absl::StrSplit(row[3], ',');
      auto ring = HashRing::Create(endpoints, {vnodes});
      ASSERT_TRUE(ring.ok()) << ring.status();
      rings.emplace(row[1], *std::move(ring));
    } else if (row[0] == "route") {
      ASSERT_EQ(row.size(), 4u);
      auto it = rings.find(row[1]);
      ASSERT_NE(it, rings.end()) << row[1];
      EXPECT_EQ(it->second.Route(row[2]), row[3]) << "ring " << row[1] << " key '" << row[2]
                                                  << "'";
      ++routes;
    }
  }
  EXPECT_EQ(rings.size(), 3u);
  EXPECT_GE(routes, 300);
}

TEST(HashRingTest, RejectsBadInput) {
  EXPECT_EQ(HashRing::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HashRing::Create({"a:1", ""}).status().code(), absl::StatusCode::kInvalidArgument);
  auto dup = HashRing::Create({"a:1", "b:1", "a:1"});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("duplicated endpoint a:1"), std::string::npos);
  auto zero = HashRing::Create({"a:1"}, {0});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("virtual_nodes"), std::string::npos);
  EXPECT_EQ(HashRing::Create({"a:1"}, {kMaxVirtualNodes + 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto ring = HashRing::Create({"a:1"});
  ASSERT_TRUE(ring.ok());
  EXPECT_EQ(ring->WithoutEndpoint("b:1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ring->WithoutEndpoint("a:1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ring->WithEndpoint("a:1").status().code(), absl::StatusCode::kInvalidArgument);
}

std::vector<std::string> Endpoints(int n) {
  std::vector<std::string> e;
  for (int i = 0; i < n; ++i) e.push_back(absl::StrCat("statecached-", i, ":50051"));
  return e;
}

constexpr int kKeys = 20000;

TEST(HashRingTest, SpreadsKeysEvenly) {
  auto ring = HashRing::Create(Endpoints(8));
  ASSERT_TRUE(ring.ok());
  std::vector<int> count(8, 0);
  for (int i = 0; i < kKeys; ++i) ++count[ring->RouteIndex(absl::StrCat("conv-", i))];
  for (int c : count) {
    EXPECT_GT(c, kKeys / 8 * 0.8);
    EXPECT_LT(c, kKeys / 8 * 1.2);
  }
}

TEST(HashRingTest, RemovingAnEndpointMovesOnlyItsKeys) {
  auto ring = HashRing::Create(Endpoints(8));
  ASSERT_TRUE(ring.ok());
  const std::string removed = "statecached-3:50051";
  auto smaller = ring->WithoutEndpoint(removed);
  ASSERT_TRUE(smaller.ok());
  int moved = 0;
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = absl::StrCat("conv-", i);
    const std::string& before = ring->Route(key);
    const std::string& after = smaller->Route(key);
    if (before != removed) {
      EXPECT_EQ(before, after) << key;
    } else {
      EXPECT_NE(after, removed);
      ++moved;
    }
  }
  EXPECT_GT(moved, kKeys / 8 * 0.8);
  EXPECT_LT(moved, kKeys / 8 * 1.2);
}

TEST(HashRingTest, AddingAnEndpointMovesAboutOneNth) {
  auto ring = HashRing::Create(Endpoints(8));
  ASSERT_TRUE(ring.ok());
  const std::string added = "statecached-8:50051";
  auto bigger = ring->WithEndpoint(added);
  ASSERT_TRUE(bigger.ok());
  int moved = 0;
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = absl::StrCat("conv-", i);
    if (ring->Route(key) != bigger->Route(key)) {
      EXPECT_EQ(bigger->Route(key), added) << key;  // keys only move to the new endpoint
      ++moved;
    }
  }
  EXPECT_GT(moved, kKeys / 9 * 0.7);
  EXPECT_LT(moved, kKeys / 9 * 1.3);
}

TEST(HashRingTest, OrderOfEndpointsDoesNotMatter) {
  std::vector<std::string> e = Endpoints(5);
  auto a = HashRing::Create(e);
  std::vector<std::string> r(e.rbegin(), e.rend());
  auto b = HashRing::Create(r);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int i = 0; i < 2000; ++i) {
    const std::string key = absl::StrCat("k", i);
    EXPECT_EQ(a->Route(key), b->Route(key));
  }
}

}  // namespace
}  // namespace statecache
