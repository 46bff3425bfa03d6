#include "client/ctl/ctl_json.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/io/json.h"

namespace statecache {

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!has_items_.empty()) {
    if (has_items_.back()) out_ += ',';
    has_items_.back() = true;
  }
}

JsonWriter& JsonWriter::BeginObject() {
  BeforeValue();
  out_ += '{';
  has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::EndObject() {
  out_ += '}';
  has_items_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::BeginArray() {
  BeforeValue();
  out_ += '[';
  has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::EndArray() {
  out_ += ']';
  has_items_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::Key(absl::string_view key) {
  BeforeValue();
  AppendJsonString(key, &out_);
  out_ += ':';
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(absl::string_view value) {
  BeforeValue();
  AppendJsonString(value, &out_);
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
  return *this;
}

JsonWriter& JsonWriter::Uint(uint64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
  return *this;
}

JsonWriter& JsonWriter::Double(double value) {
  BeforeValue();
  if (std::isfinite(value)) {
    absl::StrAppend(&out_, absl::StrFormat("%.17g", value));
  } else {
    out_ += "null";
  }
  return *this;
}

JsonWriter& JsonWriter::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue();
  out_ += "null";
  return *this;
}

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Reflection;

void Scalar(JsonWriter* w, const google::protobuf::Message& m, const Reflection& r,
            const FieldDescriptor* f, int index) {
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      w->Int(rep ? r.GetRepeatedInt32(m, f, index) : r.GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      w->Int(rep ? r.GetRepeatedInt64(m, f, index) : r.GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      w->Uint(rep ? r.GetRepeatedUInt32(m, f, index) : r.GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64: {
      const uint64_t v = rep ? r.GetRepeatedUInt64(m, f, index) : r.GetUInt64(m, f);
      if (f->type() == FieldDescriptor::TYPE_FIXED64) {
        w->String(absl::StrFormat("%016x", v));
      } else {
        w->Uint(v);
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
      w->Double(rep ? r.GetRepeatedDouble(m, f, index) : r.GetDouble(m, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      w->Double(rep ? r.GetRepeatedFloat(m, f, index) : r.GetFloat(m, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      w->Bool(rep ? r.GetRepeatedBool(m, f, index) : r.GetBool(m, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      w->String((rep ? r.GetRepeatedEnum(m, f, index) : r.GetEnum(m, f))->name());
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      w->String(rep ? r.GetRepeatedString(m, f, index) : r.GetString(m, f));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      w->Message(rep ? r.GetRepeatedMessage(m, f, index) : r.GetMessage(m, f));
      break;
  }
}

}  // namespace

JsonWriter& JsonWriter::Message(const google::protobuf::Message& message) {
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  const Reflection& r = *message.GetReflection();
  BeginObject();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->type() == FieldDescriptor::TYPE_BYTES) {
      if (f->is_repeated()) continue;
      Key(absl::StrCat(f->name(), "_size")).Int(static_cast<int64_t>(r.GetString(message, f).size()));
      continue;
    }
    if (f->is_repeated()) {
      Key(f->name()).BeginArray();
      for (int j = 0; j < r.FieldSize(message, f); ++j) Scalar(this, message, r, f, j);
      EndArray();
      continue;
    }
    const bool present = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE || f->has_presence()
                             ? r.HasField(message, f)
                             : true;
    if (!present) continue;
    Key(f->name());
    Scalar(this, message, r, f, -1);
  }
  return EndObject();
}

}  // namespace statecache
