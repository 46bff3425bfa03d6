#include "kernels/io/json.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace statecache {

namespace {

absl::Status TypeError(JsonValue::Type got, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("json: expected ", want, ", got ", JsonValue::TypeName(got)));
}

}  // namespace

const char* JsonValue::TypeName(Type t) {
  switch (t) {
    case Type::kNull: return "null";
    case Type::kBool: return "bool";
    case Type::kNumber: return "number";
    case Type::kString: return "string";
    case Type::kArray: return "array";
    case Type::kObject: return "object";
  }
  return "?";
}

absl::StatusOr<bool> JsonValue::AsBool() const {
  if (!is_bool()) return TypeError(type_, "bool");
  return bool_;
}

absl::StatusOr<double> JsonValue::AsDouble() const {
  if (!is_number()) return TypeError(type_, "number");
  errno = 0;
  char* end = nullptr;
  const double d = std::strtod(str_.c_str(), &end);
  if (end != str_.c_str() + str_.size() || !std::isfinite(d)) {
    return absl::InvalidArgumentError(absl::StrCat("json: number '", str_, "' out of range"));
  }
  return d;
}

absl::StatusOr<uint64_t> JsonValue::AsUint64() const {
  if (!is_number()) return TypeError(type_, "non-negative integer");
  if (str_.empty() || str_[0] == '-') {
    return absl::InvalidArgumentError(
        absl::StrCat("json: expected non-negative integer, got '", str_, "'"));
  }
  uint64_t v = 0;
  for (char c : str_) {
    if (c < '0' || c > '9') {
      return absl::InvalidArgumentError(
          absl::StrCat("json: expected integer, got '", str_, "'"));
    }
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) {
      return absl::InvalidArgumentError(absl::StrCat("json: integer '", str_, "' overflows"));
    }
    v = v * 10 + d;
  }
  return v;
}

absl::StatusOr<int64_t> JsonValue::AsInt64() const {
  if (!is_number()) return TypeError(type_, "integer");
  const bool neg = !str_.empty() && str_[0] == '-';
  JsonValue magnitude;
  magnitude.type_ = Type::kNumber;
  magnitude.str_ = neg ? str_.substr(1) : str_;
  auto u = magnitude.AsUint64();
  if (!u.ok()) return u.status();
  const uint64_t limit = neg ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  if (*u > limit) {
    return absl::InvalidArgumentError(absl::StrCat("json: integer '", str_, "' overflows int64"));
  }
  return neg ? static_cast<int64_t>(0 - *u) : static_cast<int64_t>(*u);
}

absl::StatusOr<std::string> JsonValue::AsString() const {
  if (!is_string()) return TypeError(type_, "string");
  return str_;
}

const JsonValue* JsonValue::Find(absl::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& kv : object_) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void AppendJsonString(absl::string_view s, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 15]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

absl::StatusOr<std::vector<uint32_t>> DecodeUtf8ToCodePoints(absl::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  size_t i = 0;
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("utf8: ", what, " at byte ", i));
  };
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) {
      cps.push_back(c);
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return bad("invalid lead byte");
    }
    if (s.size() - i <= static_cast<size_t>(n)) return bad("truncated sequence");
    for (int j = 1; j <= n; ++j) {
      const unsigned char cc = static_cast<unsigned char>(s[i + j]);
      if ((cc & 0xC0) != 0x80) return bad("invalid continuation byte");
      cp = (cp << 6) | (cc & 0x3F);
    }
    static const uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n]) return bad("overlong encoding");
    if (cp > 0x10FFFF) return bad("code point above U+10FFFF");
    if (cp >= 0xD800 && cp <= 0xDFFF) return bad("encoded surrogate");
    cps.push_back(cp);
    i += n + 1;
  }
  return cps;
}

// Recursive-descent parser over a string_view; depth-limited.
class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : s_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue v;
    SkipWs();
    absl::Status st = ParseValue(0, &v);
    if (!st.ok()) return st;
    SkipWs();
    if (pos_ != s_.size()) return Error("trailing characters after the JSON value");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("json: ", what, " at offset ", pos_));
  }
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return s_[pos_]; }
  void SkipWs() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r')) {
      ++pos_;
    }
  }

  absl::Status ParseValue(int depth, JsonValue* out) {
    if (depth > kMaxJsonDepth) return Error("nesting deeper than 64");
    if (AtEnd()) return Error("unexpected end of input, expected a value");
    const char c = Peek();
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      out->type_ = JsonValue::Type::kString;
      return ParseString(&out->str_);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    if (s_.substr(pos_, 4) == "true") {
      pos_ += 4;
      out->type_ = JsonValue::Type::kBool;
      out->bool_ = true;
      return absl::OkStatus();
    }
    if (s_.substr(pos_, 5) == "false") {
      pos_ += 5;
      out->type_ = JsonValue::Type::kBool;
      out->bool_ = false;
      return absl::OkStatus();
    }
    if (s_.substr(pos_, 4) == "null") {
      pos_ += 4;
      out->type_ = JsonValue::Type::kNull;
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected character '", absl::string_view(&s_[pos_], 1), "'"));
  }

  absl::Status ParseObject(int depth, JsonValue* out) {
    out->type_ = JsonValue::Type::kObject;
    ++pos_;  // '{'
    SkipWs();
    if (!AtEnd() && Peek() == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipWs();
      if (AtEnd() || Peek() != '"') return Error("expected a string key");
      std::string key;
      absl::Status st = ParseString(&key);
      if (!st.ok()) return st;
      for (const auto& kv : out->object_) {
        if (kv.first == key) return Error(absl::StrCat("duplicate key \"", key, "\""));
      }
      SkipWs();
      if (AtEnd() || Peek() != ':') return Error("expected ':' after key");
      ++pos_;
      SkipWs();
      out->object_.emplace_back(std::move(key), JsonValue());
      st = ParseValue(depth + 1, &out->object_.back().second);
      if (!st.ok()) return st;
      SkipWs();
      if (AtEnd()) return Error("unexpected end of input in object");
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}' in object");
    }
  }

  absl::Status ParseArray(int depth, JsonValue* out) {
    out->type_ = JsonValue::Type::kArray;
    ++pos_;  // '['
    SkipWs();
    if (!AtEnd() && Peek() == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipWs();
      out->array_.emplace_back();
      absl::Status st = ParseValue(depth + 1, &out->array_.back());
      if (!st.ok()) return st;
      SkipWs();
      if (AtEnd()) return Error("unexpected end of input in array");
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']' in array");
    }
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (s_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Error("bad hex digit in \\u escape");
      }
    }
    pos_ += 4;
    *out = v;
    return absl::OkStatus();
  }

  // At '"'; decodes into *out (UTF-8). Raw bytes >= 0x80 are copied as they
  // are (validated as UTF-8 by the caller when it matters).
  absl::Status ParseString(std::string* out) {
    ++pos_;  // opening quote
    while (true) {
      if (AtEnd()) return Error("unterminated string");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in string");
      if (c != '\\') {
        out->push_back(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (AtEnd()) return Error("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          absl::Status st = ParseHex4(&cp);
          if (!st.ok()) return st;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("unpaired low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.size() - pos_ < 2 || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') {
              return Error("unpaired high surrogate");
            }
            pos_ += 2;
            uint32_t lo;
            st = ParseHex4(&lo);
            if (!st.ok()) return st;
            if (lo < 0xDC00 || lo > 0xDFFF) return Error("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Error("invalid escape");
      }
    }
  }

  // JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  absl::Status ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    auto digits = [&]() {
      size_t n = 0;
      while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
        ++pos_;
        ++n;
      }
      return n;
    };
    if (Peek() == '-') ++pos_;
    if (AtEnd()) return Error("truncated number");
    if (Peek() == '0') {
      ++pos_;
    } else if (digits() == 0) {
      return Error("expected digits in number");
    }
    if (!AtEnd() && Peek() == '.') {
      ++pos_;
      if (digits() == 0) return Error("expected digits after '.'");
    }
    if (!AtEnd() && (Peek() == 'e' || Peek() == 'E')) {
      ++pos_;
      if (!AtEnd() && (Peek() == '+' || Peek() == '-')) ++pos_;
      if (digits() == 0) return Error("expected digits in exponent");
    }
    out->type_ = JsonValue::Type::kNumber;
    out->str_ = std::string(s_.substr(start, pos_ - start));
    return absl::OkStatus();
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) {
  return JsonParser(text).ParseDocument();
}

}  // namespace statecache
