#include "client/cpp/statecache_client_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace statecache {
namespace client_wire {

v1::DType ToProto(DType d) {
  switch (d) {
    case DType::kFp32: return v1::DTYPE_FP32;
    case DType::kBf16: return v1::DTYPE_BF16;
    case DType::kFp16: return v1::DTYPE_FP16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

void SetTensor(v1::Tensor* t, DType dtype, std::initializer_list<int64_t> shape,
               absl::string_view bytes) {
  t->set_dtype(ToProto(dtype));
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(bytes.data(), bytes.size());
}

absl::string_view FloatBytes(absl::Span<const float> v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

void AddHandles(absl::Span<const SlotHandle> slots,
                google::protobuf::RepeatedPtrField<v1::SlotHandle>* out) {
  for (const SlotHandle& h : slots) {
    v1::SlotHandle* p = out->Add();
    p->set_id(h.id);
    p->set_generation(h.generation);
  }
}

void SetHandle(SlotHandle h, v1::SlotHandle* out) {
  out->set_id(h.id);
  out->set_generation(h.generation);
}

v1::SnapshotRequest SnapshotRequestFor(absl::string_view model_id, SlotHandle slot,
                                       const std::vector<std::string>& aux) {
  v1::SnapshotRequest req;
  req.set_model_id(std::string(model_id));
  SetHandle(slot, req.mutable_slot());
  for (const std::string& a : aux) req.add_aux(a);
  return req;
}

absl::StatusOr<std::vector<float>> FloatsOf(const v1::Tensor& t, absl::string_view what) {
  if (t.dtype() != v1::DTYPE_FP32 || t.data().size() % 4 != 0) {
    return absl::InternalError(absl::StrCat(what, ": server returned a non-FP32 tensor"));
  }
  std::vector<float> out(t.data().size() / 4);
  if (!out.empty()) std::memcpy(out.data(), t.data().data(), t.data().size());
  return out;
}

void KeyToWire(const PrefixKey& k, v1::PrefixKey* out) {
  out->set_hash(k.hash);
  out->set_num_tokens(k.num_tokens);
  out->set_kind(static_cast<v1::PrefixKeyKind>(k.kind));
  out->set_digest(k.digest);
}

PrefixKey KeyFromWire(const v1::PrefixKey& k) {
  PrefixKey key{k.hash(), k.num_tokens()};
  key.kind = static_cast<PrefixKeyKind>(k.kind());
  key.digest = k.digest();
  return key;
}

absl::Status ItemError(const v1::Error& e) {
  return absl::Status(static_cast<absl::StatusCode>(e.code()), e.message());
}

void LookupItemToProto(absl::string_view model_id, const LookupItem& in,
                       v1::LookupPrefixRequest* req) {
  req->set_model_id(std::string(model_id));
  if (!in.tokens.empty() || in.keys.empty()) {
    req->mutable_tokens()->mutable_ids()->Add(in.tokens.begin(), in.tokens.end());
  } else {
    for (const PrefixKey& k : in.keys) KeyToWire(k, req->mutable_keys()->add_keys());
  }
  req->set_key_kind(static_cast<v1::PrefixKeyKind>(in.key_kind));
  req->set_lease_ms(absl::ToInt64Milliseconds(in.lease));
  req->set_peek(in.peek);
}

PrefixLookup LookupFromProto(const v1::LookupPrefixResponse& r) {
  PrefixLookup out;
  out.hit = r.hit();
  out.key = KeyFromWire(r.key());
  out.lease_id = r.lease_id();
  out.lease_expiry = absl::FromUnixMillis(r.lease_expiry_unix_ms());
  out.candidate_tokens = r.candidate_tokens();
  return out;
}

}  // namespace client_wire
}  // namespace statecache
