// A small, strict JSON (RFC 8259) parser with no external dependencies.
//
// Used for safetensors headers, model config.json and JSON-lines corpora.
// Every malformed input returns kInvalidArgument with the byte offset and the
// problem; the parser never crashes or recurses without bound (nesting is
// limited to kMaxJsonDepth), so it is safe on untrusted (fuzzed) bytes.
// Duplicate object keys are rejected (safetensors and our configs never have
// them, and silently picking one is how parsers disagree).
//
//   ASSIGN_OR_RETURN(JsonValue v, ParseJson(R"({"a": [1, 2.5, "x"]})"));
//   const JsonValue* a = v.Find("a");            // nullptr when absent
//   ASSIGN_OR_RETURN(uint64_t n, (*a)[0].AsUint64());
//
// Strings are decoded to UTF-8 (\uXXXX escapes and surrogate pairs included);
// DecodeUtf8ToCodePoints() turns a decoded string back into code points, which
// is how the corpora store raw bytes (each code point 0..255 = one byte).
#ifndef STATECACHE_KERNELS_IO_JSON_H_
#define STATECACHE_KERNELS_IO_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace statecache {

inline constexpr int kMaxJsonDepth = 64;

class JsonValue {
 public:
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

  JsonValue() = default;

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Typed accessors: kInvalidArgument when the type (or range) does not fit.
  absl::StatusOr<bool> AsBool() const;
  absl::StatusOr<double> AsDouble() const;
  // Exact non-negative integer written without fraction or exponent
  // ("12", not "12.0" or "1.2e1"); kInvalidArgument on overflow.
  absl::StatusOr<uint64_t> AsUint64() const;
  // Exact integer (optionally negative) in int64 range.
  absl::StatusOr<int64_t> AsInt64() const;
  absl::StatusOr<std::string> AsString() const;

  // Raw members (valid for the matching type only; empty otherwise).
  const std::string& string_value() const { return str_; }  // string, or number text
  const std::vector<JsonValue>& array() const { return array_; }
  const std::vector<std::pair<std::string, JsonValue>>& object() const { return object_; }
  size_t size() const { return is_array() ? array_.size() : object_.size(); }
  const JsonValue& operator[](size_t i) const { return array_[i]; }

  // Object member by key, or nullptr (also for non-objects).
  const JsonValue* Find(absl::string_view key) const;

  // "null", "bool", "number", "string", "array", "object".
  static const char* TypeName(Type t);

 private:
  friend class JsonParser;
  Type type_ = Type::kNull;
  bool bool_ = false;
  std::string str_;  // string contents (UTF-8) or the number's source text
  std::vector<JsonValue> array_;
  std::vector<std::pair<std::string, JsonValue>> object_;
};

// Parses exactly one JSON value (surrounding whitespace allowed).
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// UTF-8 -> code points; kInvalidArgument on malformed UTF-8 (overlong forms,
// surrogates, truncation).
absl::StatusOr<std::vector<uint32_t>> DecodeUtf8ToCodePoints(absl::string_view utf8);

// Appends code point `cp` (<= 0x10FFFF) as UTF-8.
void AppendUtf8(uint32_t cp, std::string* out);

// Appends `s` as a JSON string literal (quotes included; control characters,
// quote and backslash escaped; other bytes copied as they are).
void AppendJsonString(absl::string_view s, std::string* out);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_IO_JSON_H_
