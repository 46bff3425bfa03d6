// Reader and writer for the safetensors format (huggingface/safetensors).
//
// File layout: u64 little-endian N, then N bytes of JSON header
//   {"__metadata__": {str: str}, "name": {"dtype": "F32", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// then the data buffer; offsets are relative to the start of the buffer.
//
// The reader loads the whole file into memory and validates everything up
// front, so later accessors only fail for a missing name or a dtype that does
// not convert. Malformed input (truncated file, header length past the end,
// bad JSON, unknown dtype or field, negative/overflowing shape, offsets out of
// range, overlapping, or not equal to prod(shape) * dtype size, non-string
// metadata) is kInvalidArgument with a message naming the tensor and field;
// a missing file is kNotFound. It never crashes on any input (fuzzed).
//
//   ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open("golden.safetensors"));
//   ASSIGN_OR_RETURN(TensorView t, f.tensor("logits"));   // t.shape == {64, 256}
//   ASSIGN_OR_RETURN(std::vector<float> logits, f.ToFloat32("logits"));
//
//   SafetensorsWriter w;
//   w.SetMetadata("format", "damp");
//   RETURN_IF_ERROR(w.AddFloat32("layer0.perm_scores", {4, 128}, scores));
//   RETURN_IF_ERROR(w.WriteFile("/tmp/layout.safetensors"));
//
// The writer produces the same layout as the Python `safetensors` package:
// compact JSON header padded with spaces so the data starts 8-byte aligned,
// tensors laid out back to back ordered by dtype (widest first, safetensors'
// Dtype order) then name, so every tensor is aligned to its element size.
//
// Thread-safety: a SafetensorsFile is immutable after Open and safe for
// concurrent reads. SafetensorsWriter is not thread-safe.
#ifndef STATECACHE_KERNELS_IO_SAFETENSORS_H_
#define STATECACHE_KERNELS_IO_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace statecache {

enum class SafetensorsDtype : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kI8 };

// "F32", "F16", "BF16", "I32", "I64", "U8", "I8".
const char* SafetensorsDtypeName(SafetensorsDtype dtype);
// Bytes per element.
int SafetensorsDtypeSize(SafetensorsDtype dtype);
// Parses the names above (case-sensitive); kInvalidArgument otherwise.
absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name);

// A tensor inside a SafetensorsFile; `bytes` points into the file's buffer
// and is valid while the file object lives (and is not moved-from).
// Data is little-endian and not necessarily aligned in memory: read with
// memcpy or the ToFloat32 / ToInt64 helpers.
struct TensorView {
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  absl::string_view bytes;

  int64_t num_elements() const;
  // "F32[64, 256]".
  std::string DebugString() const;
};

class SafetensorsFile {
 public:
  // Reads and validates the file. kNotFound when it does not exist,
  // kPermissionDenied / kInternal for other I/O errors, kInvalidArgument
  // (prefixed with the path) when malformed.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // Validates an in-memory file image (takes ownership).
  static absl::StatusOr<SafetensorsFile> FromBytes(std::string bytes);

  // Tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(absl::string_view name) const;
  int size() const { return static_cast<int>(tensors_.size()); }

  // kNotFound (naming the tensor) when absent.
  absl::StatusOr<TensorView> tensor(absl::string_view name) const;

  // The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // F32 / F16 / BF16 tensor converted to float32, row-major.
  // kNotFound when absent, kInvalidArgument for integer dtypes.
  absl::StatusOr<std::vector<float>> ToFloat32(absl::string_view name) const;
  // Same, and checks the shape equals `want_shape` (kInvalidArgument naming
  // the tensor with both shapes otherwise).
  absl::StatusOr<std::vector<float>> ToFloat32(absl::string_view name,
                                               const std::vector<int64_t>& want_shape) const;
  // I32 / I64 / U8 / I8 tensor widened to int64; kInvalidArgument for floats.
  absl::StatusOr<std::vector<int64_t>> ToInt64(absl::string_view name) const;

 private:
  struct Entry {
    SafetensorsDtype dtype;
    std::vector<int64_t> shape;
    uint64_t begin;  // absolute offsets into bytes_
    uint64_t end;
  };
  SafetensorsFile() = default;

  std::string bytes_;
  std::map<std::string, Entry, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file in memory. Tensors are copied on Add.
class SafetensorsWriter {
 public:
  // kInvalidArgument when `bytes.size()` != prod(shape) * dtype size, a
  // dimension is negative, or the name is empty or "__metadata__";
  // kAlreadyExists when the name was added before.
  absl::Status Add(absl::string_view name, SafetensorsDtype dtype,
                   const std::vector<int64_t>& shape, absl::string_view bytes);
  absl::Status AddFloat32(absl::string_view name, const std::vector<int64_t>& shape,
                          absl::Span<const float> values);
  absl::Status AddInt32(absl::string_view name, const std::vector<int64_t>& shape,
                        absl::Span<const int32_t> values);
  absl::Status AddInt64(absl::string_view name, const std::vector<int64_t>& shape,
                        absl::Span<const int64_t> values);
  // Sets (or replaces) one "__metadata__" entry.
  void SetMetadata(absl::string_view key, absl::string_view value);

  // The complete file image.
  std::string Serialize() const;
  // Writes Serialize() to `path` (via a temporary file + rename, so readers
  // never see a partial file). kInternal / kPermissionDenied / kNotFound on
  // I/O errors, naming the path.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Pending {
    SafetensorsDtype dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::map<std::string, Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_IO_SAFETENSORS_H_
