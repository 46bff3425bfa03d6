#include "client/cpp/local_pool.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/layout/layout_file.h"

namespace statecache {

absl::StatusOr<StateLayout> LocalPool::Layout(const LocalPoolOptions& options) {
  RETURN_IF_ERROR(options.geometry.Validate());
  if (IsStepQuantFormat(options.format.format)) {
    return absl::UnimplementedError(
        absl::StrCat("format: ", FormatSpecName(options.format),
                     " pools over caller memory are not supported (per-head sizes)"));
  }
  if (options.layout_layer >= 0 && options.layout_path.empty()) {
    return absl::InvalidArgumentError("layout_layer: set without a layout file");
  }
  if (options.layout_path.empty()) return StateLayout::Identity(options.geometry, options.format);
  if (options.layout_layer < 0) {
    ASSIGN_OR_RETURN(LayoutFile file,
                     ReadLayoutFile(options.layout_path, &options.geometry, &options.format));
    return std::move(file.layout);
  }
  if (options.geometry.layers != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout_layer: a pool of one file layer has 1 layer, geometry.layers is ",
        options.geometry.layers));
  }
  ASSIGN_OR_RETURN(LayoutFile file, ReadLayoutFile(options.layout_path, nullptr, &options.format));
  ModelGeometry want = file.layout.geometry();
  want.layers = 1;
  if (!(want == options.geometry)) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry: ", options.layout_path, " holds ",
                     file.layout.geometry().DebugString(), ", the pool is ",
                     options.geometry.DebugString(), " (layers aside)"));
  }
  if (options.layout_layer >= file.layout.geometry().layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout_layer: ", options.layout_layer, " is outside the file's ",
                     file.layout.geometry().layers, " layers"));
  }
  return file.layout.Layer(options.layout_layer);
}

absl::StatusOr<std::unique_ptr<LocalPool>> LocalPool::Create(const LocalPoolOptions& options,
                                                             void* base, int64_t bytes,
                                                             int64_t slot_stride) {
  ASSIGN_OR_RETURN(StateLayout layout, Layout(options));
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "base: the pool's memory must be ", kAlignment, "-byte aligned and not null"));
  }
  const int64_t slot_bytes = layout.slot_bytes();
  if (bytes < slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes, " hold no slot of ",
                                                   slot_bytes, " bytes (",
                                                   FormatSpecName(options.format), ")"));
  }
  const int64_t stride = slot_stride == 0 ? slot_bytes : slot_stride;
  if (stride < slot_bytes || stride % kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot_stride: ", slot_stride, " bytes; want 0 (packed) or a multiple of ", kAlignment,
        " of at least the slot's ", slot_bytes, " bytes (", FormatSpecName(options.format), ")"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(options.backend));
  ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> prepared, backend->Prepare(layout));
  const ModelGeometry& g = layout.geometry();
  PoolView view;
  view.base = static_cast<uint8_t*>(base);
  view.num_slots = (bytes - slot_bytes) / stride + 1;  // the last slot needs no tail
  view.slot_stride = stride == slot_bytes ? 0 : stride;
  view.layers = g.layers;
  view.heads = g.h_v;
  view.head_bytes = layout.head_layout().head_bytes;
  return std::unique_ptr<LocalPool>(
      new LocalPool(std::move(backend), std::move(layout), std::move(prepared), view));
}

}  // namespace statecache
