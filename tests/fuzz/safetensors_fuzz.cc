// Fuzz target: the safetensors reader (kernels/io/safetensors.h) on arbitrary
// file images. Every accessor of a file that validated must stay in bounds.
#include <cstdint>
#include <string>

#include "kernels/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<statecache::SafetensorsFile> f = statecache::SafetensorsFile::FromBytes(
      std::string(reinterpret_cast<const char*>(data), size));
  if (!f.ok()) return 0;
  for (const std::string& name : f->names()) {
    (void)f->tensor(name);
    (void)f->ToFloat32(name);
    (void)f->ToInt64(name);
  }
  (void)f->metadata();
  return 0;
}
