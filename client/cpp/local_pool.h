// LocalPool: statecache's engine ops (StreamOps: decode, prefill, pack,
// unpack, slot copy) on state memory the caller owns - an engine's own cache
// tensor - with no server. The engine keeps allocating, freeing and indexing
// its slots; statecache supplies the packed format, the layout's maps and
// the kernels. Slot s of the pool is bytes [s * stride, s * stride +
// slot_bytes) of the caller's memory (stride = slot_bytes, or the engine's
// record size when the state is one part of a bigger per-sequence record,
// as in vLLM's mamba pages), laid out as a server's slot
// ([layers][h_v][head_bytes]), so a slot's bytes move between a local pool
// and statecached unchanged (Import / Export, checkpoints) when both use the
// same layout. The bytes between a slot's end and the next stride are never
// read or written.
//
// What is trusted: the memory stays valid and is not resized while the pool
// is used; nothing else writes it during an op. Checked: the geometry, the
// format, a layout file's geometry and format against them, and that the
// memory holds at least one slot at an address the kernels can use.
//
//   LocalPoolOptions o{.backend = "cuda", .geometry = g, .format = damp16};
//   ASSIGN_OR_RETURN(StateLayout layout, LocalPool::Layout(o));       // slot_bytes() to size it
//   ASSIGN_OR_RETURN(auto pool, LocalPool::Create(o, base, bytes));
//   pool->backend().stream_ops().EnqueueDecode(pool->prepared(), pool->pool(), layer, in,
//                                              record, stream);
#ifndef STATECACHE_CLIENT_CPP_LOCAL_POOL_H_
#define STATECACHE_CLIENT_CPP_LOCAL_POOL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/geometry.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

struct LocalPoolOptions {
  std::string backend = "auto";  // "cpu", "cuda", "cuda:<n>" or "auto" (create_backend.h)
  ModelGeometry geometry;
  FormatSpec format;
  // A layout file (calibrated key permutation / value maps; its geometry
  // and format must equal the ones above), or "" for the identity layout.
  std::string layout_path;
  // >= 0: the pool holds one layer (geometry.layers == 1) and takes layer
  // `layout_layer` of the layout file, whose geometry may have more layers
  // (an engine keeping each layer's states apart, one pool per layer).
  int layout_layer = -1;
};

class LocalPool {
 public:
  // Memory of the pool: at least 16-byte aligned (the kernels' widest load).
  static constexpr int64_t kAlignment = 16;

  // The layout of the options (slot_bytes() sizes the caller's memory).
  // kInvalidArgument naming the field for a bad geometry, format, layout
  // file or layout_layer; kUnimplemented for the STEPQuant formats (their
  // per-head sizes need a head-offset table in backend memory).
  static absl::StatusOr<StateLayout> Layout(const LocalPoolOptions& options);

  // A pool over `bytes` of backend memory at `base` (host memory on the CPU
  // backend, device memory of the backend's device on CUDA - device 0, or n
  // for "cuda:<n>" - which the CUDA backend makes current for the calling
  // thread), slot s at base + s *
  // slot_stride (0: slot_bytes, packed): as many slots as fit, the last one
  // needing only slot_bytes; the rest unused. Errors as Layout, plus
  // kInvalidArgument naming "base" (null or misaligned), "bytes" (less than
  // one slot) or "slot_stride" (not 0, below slot_bytes or not a multiple of
  // kAlignment), kUnavailable for "cuda" without a GPU.
  static absl::StatusOr<std::unique_ptr<LocalPool>> Create(const LocalPoolOptions& options,
                                                           void* base, int64_t bytes,
                                                           int64_t slot_stride = 0);

  LocalPool(const LocalPool&) = delete;
  LocalPool& operator=(const LocalPool&) = delete;

  Backend& backend() { return *backend_; }
  const StateLayout& layout() const { return layout_; }
  const PreparedModel& prepared() const { return *prepared_; }
  // No fence: the caller owns the memory and its lifetime.
  const PoolView& pool() const { return view_; }

 private:
  LocalPool(std::unique_ptr<Backend> backend, StateLayout layout,
            std::unique_ptr<PreparedModel> prepared, PoolView view)
      : backend_(std::move(backend)),
        layout_(std::move(layout)),
        prepared_(std::move(prepared)),
        view_(view) {}

  std::unique_ptr<Backend> backend_;
  StateLayout layout_;
  std::unique_ptr<PreparedModel> prepared_;
  PoolView view_;
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CPP_LOCAL_POOL_H_
