#include "server/core/host_update.h"

#include <cstring>

#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

constexpr int64_t kAlign = 256;

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
                           double* kernel_seconds, UpdatePhases* phases) {
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
    const absl::Duration d = absl::Now() - start;
    *kernel_seconds = absl::ToDoubleSeconds(d);
    if (phases != nullptr) phases->Add(UpdatePhases::kBackend, d);
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
  const int64_t o_offset = total, o_bytes = b * row.o;
  PhaseClock clock(phases);
  // The same offsets on both sides: the device block holds the inputs and
  // o, the host block the packed inputs and, after the call, o.
  ASSIGN_OR_RETURN(StagingCache::Lease buf, staging.Get(total + Aligned(o_bytes)));
  ASSIGN_OR_RETURN(StagingCache::Lease host, staging.GetHost(total + Aligned(o_bytes)));
  uint8_t* base = buf.data();
  for (const Part& p : parts) std::memcpy(host.data() + p.offset, p.host, p.bytes);
  clock.Lap(UpdatePhases::kStage);
  in.slots = reinterpret_cast<const int32_t*>(base + parts[0].offset);
  in.q = base + parts[1].offset;
  in.k = base + parts[2].offset;
  in.v = base + parts[3].offset;
  in.g = reinterpret_cast<const float*>(base + parts[4].offset);
  in.beta = reinterpret_cast<const float*>(base + parts[5].offset);
  in.o = reinterpret_cast<float*>(base + o_offset);
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(backend.DecodeUpdateStaged(model, pool, layer, in, base, host.data(), total,
                                             host.data() + o_offset, o_bytes));
  *kernel_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  clock.Lap(UpdatePhases::kBackend);
  std::memcpy(u.o, host.data() + o_offset, o_bytes);
  clock.Lap(UpdatePhases::kCopyOut);
  return absl::OkStatus();
}

}  // namespace statecache
