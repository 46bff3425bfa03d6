#include "kernels/io/json.h"

#include <string>

#include "gtest/gtest.h"

namespace statecache {
namespace {

TEST(JsonTest, ParsesNestedValues) {
  auto v = ParseJson(R"( {"a": [1, -2.5e3, "x", true, false, null], "b": {}} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  const JsonValue* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->size(), 6u);
  EXPECT_EQ(*(*a)[0].AsUint64(), 1u);
  EXPECT_EQ(*(*a)[1].AsDouble(), -2500.0);
  EXPECT_EQ(*(*a)[2].AsString(), "x");
  EXPECT_EQ(*(*a)[3].AsBool(), true);
  EXPECT_EQ(*(*a)[4].AsBool(), false);
  EXPECT_TRUE((*a)[5].is_null());
  EXPECT_TRUE(v->Find("b")->is_object());
  EXPECT_EQ(v->Find("c"), nullptr);
}

TEST(JsonTest, DecodesEscapesAndSurrogates) {
  auto v = ParseJson(R"("q\"b\\s\/n\n\u00e9\ud83d\ude00\u0000")");
  ASSERT_TRUE(v.ok()) << v.status();
  const std::string want = std::string("q\"b\\s/n\n\xC3\xA9\xF0\x9F\x98\x80") + std::string(1, '\0');
  EXPECT_EQ(v->string_value(), want);
  auto cps = DecodeUtf8ToCodePoints(v->string_value());
  ASSERT_TRUE(cps.ok());
  EXPECT_EQ((*cps)[8], 0xE9u);
  EXPECT_EQ((*cps)[9], 0x1F600u);
  EXPECT_EQ((*cps)[10], 0u);
}

TEST(JsonTest, IntegerAccessors) {
  EXPECT_EQ(*ParseJson("18446744073709551615")->AsUint64(), UINT64_MAX);
  EXPECT_EQ(ParseJson("18446744073709551616")->AsUint64().status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseJson("-1")->AsUint64().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseJson("1.0")->AsUint64().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseJson("1e2")->AsUint64().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseJson("-9223372036854775808")->AsInt64(), INT64_MIN);
  EXPECT_EQ(ParseJson("9223372036854775808")->AsInt64().status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseJson("\"1\"")->AsUint64().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JsonTest, RejectsMalformedInput) {
  const char* bad[] = {
      "",          "{",          "[1,]",        "{\"a\":1,}",  "{\"a\" 1}",   "{1:2}",
      "01",        "1.",         "-",           "1e",          "+1",          "tru",
      "nul",       "\"abc",      "\"\\x\"",     "\"\\u12\"",   "\"\\ud800\"", "\"\\udc00\"",
      "[1] [2]",   "{\"a\":1,\"a\":2}", "\"a\nb\"", "NaN",     "[\"\\ud800\\u0041\"]",
  };
  for (const char* s : bad) {
    auto v = ParseJson(s);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << "input: " << s;
  }
}

TEST(JsonTest, DepthIsLimited) {
  std::string ok_deep(kMaxJsonDepth, '[');
  ok_deep += std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJson(ok_deep).ok());
  std::string too_deep(100000, '[');
  auto v = ParseJson(too_deep);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("nesting"), absl::string_view::npos);
}

TEST(JsonTest, Utf8DecoderRejectsMalformed) {
  for (const char* s : {"\xC3", "\xC0\x80", "\xED\xA0\x80", "\xF8\x88\x80\x80\x80", "\x80",
                        "\xE2\x28\xA1", "\xF4\x90\x80\x80"}) {
    EXPECT_EQ(DecodeUtf8ToCodePoints(s).status().code(), absl::StatusCode::kInvalidArgument)
        << s;
  }
  auto cps = DecodeUtf8ToCodePoints("a\xC3\xBF");
  ASSERT_TRUE(cps.ok());
  EXPECT_EQ(*cps, (std::vector<uint32_t>{'a', 0xFF}));
}

TEST(JsonTest, StringWriterRoundTrips) {
  std::string raw = "a\"b\\c\n\x01\x7f";
  std::string lit;
  AppendJsonString(raw, &lit);
  auto v = ParseJson(lit);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->string_value(), raw);
}

}  // namespace
}  // namespace statecache
