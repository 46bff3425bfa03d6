// Fuzz target: Import of arbitrary packed bytes into a live slot with the
// model's own compatibility tags (the decode and finiteness check of
// untrusted packed states). Byte 0 picks the model; the rest, zero-padded or
// truncated to slot_bytes when byte 1 is odd, is the packed state. Accepted
// bytes must export back bit for bit; rejected ones must leave every slot
// unchanged; no slot may ever decode to NaN/Inf.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/core/proto_convert.h"
#include "tests/fuzz/service_fixture.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace statecache;  // NOLINT
  if (size < 2) return 0;
  ServiceFixture& f = ServiceFixture::Get();
  const int which = data[0] & 1;
  std::shared_ptr<Model> m = f.model(which);
  std::string packed(reinterpret_cast<const char*>(data + 2), size - 2);
  if (data[1] & 1) packed.resize(m->slots->slot_bytes(), '\0');
  v1::ImportRequest req;
  req.set_model_id(m->id);
  HandleToProto(f.slots(which)[0], req.mutable_slot());
  TagsToProto(m->id, m->layout, req.mutable_tags());
  req.set_packed(packed);
  const std::string before = f.ArenaBytes();
  const absl::Status status = f.service().DoImport(f.caller(), req);
  if (status.ok()) {
    v1::ExportRequest ex;
    ex.set_model_id(m->id);
    *ex.mutable_slot() = req.slot();
    v1::ExportResponse out;
    if (!f.service().DoExport(f.caller(), ex, &out).ok() || out.packed() != packed) std::abort();
  }
  f.Check(status, before);
  return 0;
}
