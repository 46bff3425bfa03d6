#include "kernels/io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/formats/numeric.h"
#include "kernels/io/json.h"

namespace statecache {

namespace {

// The Python package refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  int size;
  int rank;  // position in safetensors' Rust `Dtype` enum (layout order)
  bool is_float;
};

constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::kF32, "F32", 4, 11, true},
    {SafetensorsDtype::kF16, "F16", 2, 7, true},
    {SafetensorsDtype::kBF16, "BF16", 2, 8, true},
    {SafetensorsDtype::kI32, "I32", 4, 9, false},
    {SafetensorsDtype::kI64, "I64", 8, 13, false},
    {SafetensorsDtype::kU8, "U8", 1, 1, false},
    {SafetensorsDtype::kI8, "I8", 1, 2, false},
};

const DtypeInfo& Info(SafetensorsDtype d) {
  for (const DtypeInfo& i : kDtypes) {
    if (i.dtype == d) return i;
  }
  return kDtypes[0];
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

// prod(shape) * elem_size with overflow checks; false on overflow/negative.
bool ByteSize(const std::vector<int64_t>& shape, int elem_size, uint64_t* out) {
  uint64_t n = static_cast<uint64_t>(elem_size);
  for (int64_t d : shape) {
    if (d < 0) return false;
    const uint64_t ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > UINT64_MAX / ud) return false;
    n *= ud;
  }
  *out = n;
  return true;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

uint16_t LoadU16(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

const char* SafetensorsDtypeName(SafetensorsDtype dtype) { return Info(dtype).name; }
int SafetensorsDtypeSize(SafetensorsDtype dtype) { return Info(dtype).size; }

absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name) {
  for (const DtypeInfo& i : kDtypes) {
    if (name == i.name) return i.dtype;
  }
  return Invalid(absl::StrCat("unsupported dtype \"", name,
                              "\" (expected F32, F16, BF16, I32, I64, U8 or I8)"));
}


int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::DebugString() const {
  return absl::StrCat(SafetensorsDtypeName(dtype), ShapeString(shape));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    const std::string msg = absl::StrCat("safetensors: cannot open ", path, ": ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::InternalError(msg);
  }
  std::string bytes;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) {
    return absl::InternalError(
        absl::StrCat("safetensors: cannot read ", path, ": ", std::strerror(err)));
  }
  auto file = FromBytes(std::move(bytes));
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(path, ": ", file.status().message()));
  }
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::string bytes) {
  if (bytes.size() < 8) {
    return Invalid(absl::StrCat("truncated file: ", bytes.size(),
                                " bytes, need at least 8 for the header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  }
  if (header_len > bytes.size() - 8) {
    return Invalid(absl::StrCat("header length ", header_len, " exceeds the file (",
                                bytes.size() - 8, " bytes after the length)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return Invalid(absl::StrCat("header length ", header_len, " above the 100 MB limit"));
  }
  auto header = ParseJson(absl::string_view(bytes).substr(8, header_len));
  if (!header.ok()) return Invalid(absl::StrCat("header: ", header.status().message()));
  if (!header->is_object()) return Invalid("header: top level is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = bytes.size() - data_start;

  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // relative [begin, end)
  std::vector<const std::string*> range_names;
  for (const auto& kv : header->object()) {
    const std::string& name = kv.first;
    const JsonValue& v = kv.second;
    if (name == "__metadata__") {
      if (!v.is_object()) return Invalid("__metadata__ is not a JSON object");
      for (const auto& m : v.object()) {
        if (!m.second.is_string()) {
          return Invalid(absl::StrCat("__metadata__ value of \"", m.first, "\" is a ",
                                      JsonValue::TypeName(m.second.type()),
                                      ", expected a string"));
        }
        file.metadata_[m.first] = m.second.string_value();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor \"", name, "\"");
    if (!v.is_object()) return Invalid(absl::StrCat(where, ": entry is not a JSON object"));
    const JsonValue* dtype_v = nullptr;
    const JsonValue* shape_v = nullptr;
    const JsonValue* offsets_v = nullptr;
    for (const auto& field : v.object()) {
      if (field.first == "dtype") {
        dtype_v = &field.second;
      } else if (field.first == "shape") {
        shape_v = &field.second;
      } else if (field.first == "data_offsets") {
        offsets_v = &field.second;
      } else {
        return Invalid(absl::StrCat(where, ": unexpected field \"", field.first, "\""));
      }
    }
    if (dtype_v == nullptr) return Invalid(absl::StrCat(where, ": missing dtype"));
    if (shape_v == nullptr) return Invalid(absl::StrCat(where, ": missing shape"));
    if (offsets_v == nullptr) return Invalid(absl::StrCat(where, ": missing data_offsets"));
    if (!dtype_v->is_string()) return Invalid(absl::StrCat(where, ": dtype is not a string"));
    auto dtype = ParseSafetensorsDtype(dtype_v->string_value());
    if (!dtype.ok()) return Invalid(absl::StrCat(where, ": ", dtype.status().message()));

    Entry e;
    e.dtype = *dtype;
    if (!shape_v->is_array()) return Invalid(absl::StrCat(where, ": shape is not an array"));
    for (size_t i = 0; i < shape_v->size(); ++i) {
      auto d = (*shape_v)[i].AsUint64();
      if (!d.ok() || *d > static_cast<uint64_t>(INT64_MAX)) {
        return Invalid(absl::StrCat(where, ": shape[", i, "] is not a non-negative integer"));
      }
      e.shape.push_back(static_cast<int64_t>(*d));
    }
    if (!offsets_v->is_array() || offsets_v->size() != 2) {
      return Invalid(absl::StrCat(where, ": data_offsets is not an array of 2 integers"));
    }
    auto begin = (*offsets_v)[0].AsUint64();
    auto end = (*offsets_v)[1].AsUint64();
    if (!begin.ok() || !end.ok()) {
      return Invalid(absl::StrCat(where, ": data_offsets are not non-negative integers"));
    }
    if (*begin > *end) {
      return Invalid(absl::StrCat(where, ": data_offsets [", *begin, ", ", *end,
                                  "] has begin > end"));
    }
    if (*end > data_size) {
      return Invalid(absl::StrCat(where, ": data_offsets end ", *end,
                                  " is beyond the data buffer (", data_size, " bytes)"));
    }
    uint64_t want = 0;
    if (!ByteSize(e.shape, Info(e.dtype).size, &want)) {
      return Invalid(absl::StrCat(where, ": shape ", ShapeString(e.shape), " overflows"));
    }
    if (*end - *begin != want) {
      return Invalid(absl::StrCat(where, ": data_offsets span ", *end - *begin,
                                  " bytes but ", Info(e.dtype).name, ShapeString(e.shape),
                                  " needs ", want));
    }
    e.begin = data_start + *begin;
    e.end = data_start + *end;
    ranges.emplace_back(*begin, *end);
    range_names.push_back(&name);
    file.tensors_.emplace(name, std::move(e));
  }

  // Overlap check over non-empty ranges, in offset order.
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  uint64_t prev_end = 0;
  const std::string* prev_name = nullptr;
  for (size_t i : order) {
    if (ranges[i].first == ranges[i].second) continue;
    if (prev_name != nullptr && ranges[i].first < prev_end) {
      return Invalid(absl::StrCat("tensors \"", *prev_name, "\" and \"", *range_names[i],
                                  "\" overlap in the data buffer"));
    }
    prev_end = ranges[i].second;
    prev_name = range_names[i];
  }

  file.bytes_ = std::move(bytes);
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

bool SafetensorsFile::contains(absl::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

absl::StatusOr<TensorView> SafetensorsFile::tensor(absl::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("safetensors: no tensor \"", name, "\""));
  }
  TensorView v;
  v.dtype = it->second.dtype;
  v.shape = it->second.shape;
  v.bytes = absl::string_view(bytes_).substr(it->second.begin, it->second.end - it->second.begin);
  return v;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ToFloat32(absl::string_view name) const {
  auto t = tensor(name);
  if (!t.ok()) return t.status();
  const int64_t n = t->num_elements();
  std::vector<float> out(static_cast<size_t>(n));
  const char* p = t->bytes.data();
  switch (t->dtype) {
    case SafetensorsDtype::kF32:
      if (n > 0) std::memcpy(out.data(), p, static_cast<size_t>(n) * 4);
      break;
    case SafetensorsDtype::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = HalfBitsToFloat(LoadU16(p + 2 * i));
      break;
    case SafetensorsDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16BitsToFloat(LoadU16(p + 2 * i));
      break;
    default:
      return Invalid(absl::StrCat("tensor \"", name, "\" has dtype ",
                                  SafetensorsDtypeName(t->dtype), ", not a float type"));
  }
  return out;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ToFloat32(
    absl::string_view name, const std::vector<int64_t>& want_shape) const {
  auto t = tensor(name);
  if (!t.ok()) return t.status();
  if (t->shape != want_shape) {
    return Invalid(absl::StrCat("tensor \"", name, "\" has shape ", ShapeString(t->shape),
                                ", expected ", ShapeString(want_shape)));
  }
  return ToFloat32(name);
}

absl::StatusOr<std::vector<int64_t>> SafetensorsFile::ToInt64(absl::string_view name) const {
  auto t = tensor(name);
  if (!t.ok()) return t.status();
  if (Info(t->dtype).is_float) {
    return Invalid(absl::StrCat("tensor \"", name, "\" has dtype ",
                                SafetensorsDtypeName(t->dtype), ", not an integer type"));
  }
  const int64_t n = t->num_elements();
  std::vector<int64_t> out(static_cast<size_t>(n));
  const char* p = t->bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (t->dtype) {
      case SafetensorsDtype::kI32: {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = v;
        break;
      }
      case SafetensorsDtype::kI64:
        std::memcpy(&out[i], p + 8 * i, 8);
        break;
      case SafetensorsDtype::kU8:
        out[i] = static_cast<unsigned char>(p[i]);
        break;
      case SafetensorsDtype::kI8:
        out[i] = static_cast<signed char>(p[i]);
        break;
      default:
        break;  // float dtypes rejected above
    }
  }
  return out;
}

absl::Status SafetensorsWriter::Add(absl::string_view name, SafetensorsDtype dtype,
                                    const std::vector<int64_t>& shape, absl::string_view bytes) {
  if (name.empty()) return Invalid("writer: empty tensor name");
  if (name == "__metadata__") return Invalid("writer: tensor name \"__metadata__\" is reserved");
  uint64_t want = 0;
  if (!ByteSize(shape, Info(dtype).size, &want)) {
    return Invalid(absl::StrCat("writer: tensor \"", name, "\": shape ", ShapeString(shape),
                                " has a negative dimension or overflows"));
  }
  if (bytes.size() != want) {
    return Invalid(absl::StrCat("writer: tensor \"", name, "\": ", bytes.size(), " bytes but ",
                                Info(dtype).name, ShapeString(shape), " needs ", want));
  }
  const std::string key(name);
  if (tensors_.count(key) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("safetensors: writer: tensor \"", name, "\" added twice"));
  }
  tensors_[key] = Pending{dtype, shape, std::string(bytes)};
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AddFloat32(absl::string_view name,
                                           const std::vector<int64_t>& shape,
                                           absl::Span<const float> values) {
  return Add(name, SafetensorsDtype::kF32, shape,
             absl::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 4));
}

absl::Status SafetensorsWriter::AddInt32(absl::string_view name,
                                         const std::vector<int64_t>& shape,
                                         absl::Span<const int32_t> values) {
  return Add(name, SafetensorsDtype::kI32, shape,
             absl::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 4));
}

absl::Status SafetensorsWriter::AddInt64(absl::string_view name,
                                         const std::vector<int64_t>& shape,
                                         absl::Span<const int64_t> values) {
  return Add(name, SafetensorsDtype::kI64, shape,
             absl::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 8));
}

void SafetensorsWriter::SetMetadata(absl::string_view key, absl::string_view value) {
  metadata_[std::string(key)] = std::string(value);
}

std::string SafetensorsWriter::Serialize() const {
  // Data order: widest dtype first (safetensors' Dtype order, descending),
  // then name; each tensor starts at a multiple of its element size.
  std::vector<const std::pair<const std::string, Pending>*> order;
  for (const auto& kv : tensors_) order.push_back(&kv);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return Info(a->second.dtype).rank > Info(b->second.dtype).rank;
  });
  std::map<std::string, std::pair<uint64_t, uint64_t>> offsets;
  uint64_t pos = 0;
  for (const auto* kv : order) {
    offsets[kv->first] = {pos, pos + kv->second.bytes.size()};
    pos += kv->second.bytes.size();
  }

  std::string header = "{";
  bool first = true;
  if (!metadata_.empty()) {
    header.append("\"__metadata__\":{");
    bool first_m = true;
    for (const auto& m : metadata_) {
      if (!first_m) header.push_back(',');
      first_m = false;
      AppendJsonString(m.first, &header);
      header.push_back(':');
      AppendJsonString(m.second, &header);
    }
    header.push_back('}');
    first = false;
  }
  for (const auto& kv : tensors_) {  // header in name order, like the Python package
    if (!first) header.push_back(',');
    first = false;
    AppendJsonString(kv.first, &header);
    const auto& off = offsets[kv.first];
    absl::StrAppend(&header, ":{\"dtype\":\"", Info(kv.second.dtype).name, "\",\"shape\":[",
                    absl::StrJoin(kv.second.shape, ","), "],\"data_offsets\":[", off.first, ",",
                    off.second, "]}");
  }
  header.push_back('}');
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');

  std::string out;
  out.reserve(8 + header.size() + pos);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>(n & 0xFF));
    n >>= 8;
  }
  out.append(header);
  for (const auto* kv : order) out.append(kv->second.bytes);
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  const std::string data = Serialize();
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  auto io_error = [&](absl::string_view op, int err) {
    const std::string msg =
        absl::StrCat("safetensors: cannot ", op, " ", path, ": ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
    if (err == EACCES || err == EROFS) return absl::PermissionDeniedError(msg);
    return absl::InternalError(msg);
  };
  if (f == nullptr) return io_error("create", errno);
  const size_t written = std::fwrite(data.data(), 1, data.size(), f);
  const int write_err = errno;
  const bool close_failed = std::fclose(f) != 0;
  const int close_err = errno;
  if (written != data.size() || close_failed) {
    std::remove(tmp.c_str());
    return io_error("write", written != data.size() ? write_err : close_err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return io_error("rename into", err);
  }
  return absl::OkStatus();
}

}  // namespace statecache
