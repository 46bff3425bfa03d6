#include "server/core/host_update.h"

#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

constexpr int64_t kAlign = 256;
// Inputs up to this size are packed into one host buffer and copied in with
// one CopyIn (one synchronization on CUDA); larger ones are copied array by
// array (no extra host copy).
constexpr int64_t kPackBytes = int64_t{1} << 20;

int64_t Aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

bool AlignedTo(const void* p, int64_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(alignment) == 0;
}

}  // namespace

HostUpdateRow RowBytesOf(const ModelGeometry& g, DType dtype) {
  HostUpdateRow r;
  r.qk = int64_t{g.h_qk} * g.d_k * DTypeSize(dtype);
  r.v = int64_t{g.h_v} * g.d_v * DTypeSize(dtype);
  r.g = int64_t{g.h_v} * g.GateWidth() * 4;
  r.beta = int64_t{g.h_v} * 4;
  r.o = int64_t{g.h_v} * g.d_v * 4;
  return r;
}

absl::Status RunHostUpdate(Backend& backend, StagingCache& staging, const PreparedModel& model,
                           const PoolView& pool, int layer, const HostUpdate& u,
                           double* kernel_seconds) {
  *kernel_seconds = 0;
  const HostUpdateRow row = RowBytesOf(model.layout().geometry(), u.dtype);
  const int64_t b = u.batch;
  DecodeInputs in;
  in.batch = u.batch;
  in.dtype = u.dtype;
  const int elem = DTypeSize(u.dtype);
  if (backend.host_memory() && AlignedTo(u.q, elem) && AlignedTo(u.k, elem) &&
      AlignedTo(u.v, elem) && AlignedTo(u.g, 4) && AlignedTo(u.beta, 4) && AlignedTo(u.o, 4) &&
      AlignedTo(u.slots, 4)) {
    in.slots = u.slots;
    in.q = u.q;
    in.k = u.k;
    in.v = u.v;
    in.g = u.g;
    in.beta = u.beta;
    in.o = u.o;
    const absl::Time start = absl::Now();
    absl::Status st = backend.DecodeUpdate(model, pool, layer, in);
    *kernel_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return st;
  }
  struct Part {
    const void* host;
    int64_t bytes;
    int64_t offset;
  };
  Part parts[] = {{u.slots, b * row.slot, 0}, {u.q, b * row.qk, 0},     {u.k, b * row.qk, 0},
                  {u.v, b * row.v, 0},        {u.g, b * row.g, 0},      {u.beta, b * row.beta, 0}};
  int64_t total = 0;
  for (Part& p : parts) {
    p.offset = total;
    total += Aligned(p.bytes);
  }
  const int64_t o_offset = total;
  ASSIGN_OR_RETURN(StagingCache::Lease buf, staging.Get(total + Aligned(b * row.o)));
  uint8_t* base = buf.data();
  in.slots = reinterpret_cast<const int32_t*>(base + parts[0].offset);
  in.q = base + parts[1].offset;
  in.k = base + parts[2].offset;
  in.v = base + parts[3].offset;
  in.g = reinterpret_cast<const float*>(base + parts[4].offset);
  in.beta = reinterpret_cast<const float*>(base + parts[5].offset);
  in.o = reinterpret_cast<float*>(base + o_offset);
  if (total <= kPackBytes) {
    // One backend call does the copy in, the update and the copy out.
    thread_local std::vector<uint8_t> pack;
    pack.resize(static_cast<size_t>(total));
    for (const Part& p : parts) std::memcpy(pack.data() + p.offset, p.host, p.bytes);
    const absl::Time start = absl::Now();
    absl::Status st = backend.DecodeUpdateStaged(model, pool, layer, in, base, pack.data(), total,
                                                 u.o, b * row.o);
    *kernel_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return st;
  }
  for (const Part& p : parts) RETURN_IF_ERROR(backend.CopyIn(base + p.offset, p.host, p.bytes));
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(backend.DecodeUpdate(model, pool, layer, in));
  *kernel_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return backend.CopyOut(u.o, in.o, b * row.o);
}

}  // namespace statecache
