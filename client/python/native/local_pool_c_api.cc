// The local-pool half of the C ABI (dataplane_c_api.h, "Local pools"):
// LocalPool (client/cpp/local_pool.h) behind the same handle as attached
// mode, so the engine ops serve both.
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/local_pool.h"
#include "client/python/native/dataplane_c_api.h"
#include "client/python/native/handle.h"
#include "kernels/formats/format.h"

namespace {

using statecache::LocalPoolOptions;
using statecache::native::Fail;

absl::StatusOr<LocalPoolOptions> Options(const char* backend, const int32_t* geometry,
                                         float scale, const char* format,
                                         const char* layout_path, int layout_layer) {
  if (geometry == nullptr) return absl::InvalidArgumentError("geometry: null");
  if (geometry[0] != 0 && geometry[0] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry.arch: ", geometry[0], " is not 0 (GDN) or 1 (KDA)"));
  }
  if (format == nullptr) return absl::InvalidArgumentError("format: null");
  LocalPoolOptions o;
  if (backend != nullptr) o.backend = backend;
  o.geometry.arch = geometry[0] == 1 ? statecache::Arch::kKda : statecache::Arch::kGdn;
  o.geometry.layers = geometry[1];
  o.geometry.h_qk = geometry[2];
  o.geometry.h_v = geometry[3];
  o.geometry.d_k = geometry[4];
  o.geometry.d_v = geometry[5];
  o.geometry.scale = scale;
  absl::StatusOr<statecache::FormatSpec> spec = statecache::ParseFormatSpec(format);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("format: ", spec.status().message()));
  }
  o.format = *spec;
  if (layout_path != nullptr) o.layout_path = layout_path;
  o.layout_layer = layout_layer;
  return o;
}

}  // namespace

extern "C" {

int sc_local_slot_bytes(const int32_t* geometry, float scale, const char* format,
                        const char* layout_path, int layout_layer, int64_t* slot_bytes,
                        char* err, int err_len) {
  if (slot_bytes == nullptr) {
    return Fail(absl::InvalidArgumentError("slot_bytes: null"), err, err_len);
  }
  absl::StatusOr<LocalPoolOptions> o =
      Options(nullptr, geometry, scale, format, layout_path, layout_layer);
  if (!o.ok()) return Fail(o.status(), err, err_len);
  absl::StatusOr<statecache::StateLayout> layout = statecache::LocalPool::Layout(*o);
  if (!layout.ok()) return Fail(layout.status(), err, err_len);
  *slot_bytes = layout->slot_bytes();
  return 0;
}

int sc_local_pool(const char* backend, const int32_t* geometry, float scale, const char* format,
                  const char* layout_path, int layout_layer, void* base, int64_t bytes,
                  int64_t slot_stride, ScAttached** out, char* err, int err_len) {
  if (out == nullptr) return Fail(absl::InvalidArgumentError("out: null"), err, err_len);
  *out = nullptr;
  absl::StatusOr<LocalPoolOptions> o =
      Options(backend, geometry, scale, format, layout_path, layout_layer);
  if (!o.ok()) return Fail(o.status(), err, err_len);
  absl::StatusOr<std::unique_ptr<statecache::LocalPool>> pool =
      statecache::LocalPool::Create(*o, base, bytes, slot_stride);
  if (!pool.ok()) return Fail(pool.status(), err, err_len);
  auto a = std::make_unique<ScAttached>();
  a->local = *std::move(pool);
  a->cuda = !a->local->backend().host_memory();
  *out = a.release();
  return 0;
}

}  // extern "C"
