// JsonWriter: builds one JSON document (RFC 8259) for statecachectl --json.
//
// Strings are escaped by kernels/io/json.h's AppendJsonString; numbers that
// are not finite are written as null. Commas and nesting are tracked, so a
// well-formed sequence of calls always yields valid JSON; the output is
// parsed back by the tests with ParseJson.
//
//   JsonWriter w;
//   w.BeginObject().Key("model").String("qwen").Key("slots").Int(4).EndObject();
//   absl::FPrintF(out, "%s\n", w.str());
//
// Not thread-safe.
#ifndef STATECACHE_CLIENT_CTL_CTL_JSON_H_
#define STATECACHE_CLIENT_CTL_CTL_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace statecache {

class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  // Inside an object: the next value's key.
  JsonWriter& Key(absl::string_view key);
  JsonWriter& String(absl::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Uint(uint64_t value);
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  // A protobuf message as an object keyed by the proto field names (set
  // singular fields and every repeated field; proto3 scalars always):
  // integers and floating point as numbers, fixed64 as a 16-digit hex
  // string (ids, fingerprints: as statecachectl prints them), enums by
  // name, bytes as their length under "<name>_size".
  JsonWriter& Message(const google::protobuf::Message& message);

  // The document so far (complete once every Begin has its End).
  const std::string& str() const { return out_; }

 private:
  // Comma before a value (not after a key).
  void BeforeValue();

  std::string out_;
  std::vector<bool> has_items_;  // per open container
  bool after_key_ = false;
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CTL_CTL_JSON_H_
