#include "client/model/backend_state_store.h"

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {

namespace {
int64_t Align256(int64_t n) { return (n + 255) / 256 * 256; }
}  // namespace

absl::StatusOr<std::unique_ptr<BackendStateStore>> BackendStateStore::Create(
    Backend* backend, const StateLayout& layout) {
  if (backend == nullptr) return absl::InvalidArgumentError("backend: null");
  std::unique_ptr<BackendStateStore> s(new BackendStateStore(backend, layout));
  ASSIGN_OR_RETURN(s->prepared_, backend->Prepare(s->layout_));
  const ModelGeometry& g = s->layout_.geometry();
  ASSIGN_OR_RETURN(s->slot_buffer_, backend->Allocate(s->layout_.slot_bytes()));
  s->pool_.base = s->slot_buffer_->data();
  s->pool_.num_slots = 1;
  s->pool_.layers = g.layers;
  s->pool_.heads = g.h_v;
  s->pool_.head_bytes = s->layout_.head_layout().head_bytes;
  ASSIGN_OR_RETURN(s->slot_index_, backend->Allocate(sizeof(int32_t)));
  const int32_t zero = 0;
  RETURN_IF_ERROR(backend->CopyIn(s->slot_index_->data(), &zero, sizeof(zero)));
  RETURN_IF_ERROR(s->Reset());
  return s;
}

std::string BackendStateStore::Describe() const {
  return absl::StrCat(backend_->name(), " backend, ", FormatSpecName(layout_.format()),
                      layout_.identity_key_perm() ? " (identity layout)" : " (calibrated layout)",
                      ", ", layout_.slot_bytes(), " bytes/sequence");
}

absl::Status BackendStateStore::EnsureStaging(int64_t bytes) {
  if (staging_ != nullptr && staging_->size() >= bytes) return absl::OkStatus();
  ASSIGN_OR_RETURN(staging_, backend_->Allocate(bytes));
  return absl::OkStatus();
}

absl::StatusOr<BackendStateStore::Staged> BackendStateStore::Stage(const RecurrentInputs& in,
                                                                   bool with_o) {
  const ModelGeometry& g = layout_.geometry();
  const int64_t T = in.tokens;
  const int64_t nq = T * g.h_qk * g.d_k * 4, nv = T * g.h_v * g.d_v * 4,
                ng = T * g.h_v * g.GateWidth() * 4, nb = T * g.h_v * 4;
  const int64_t offs[6] = {0,
                           Align256(nq),
                           2 * Align256(nq),
                           2 * Align256(nq) + Align256(nv),
                           2 * Align256(nq) + Align256(nv) + Align256(ng),
                           2 * Align256(nq) + Align256(nv) + Align256(ng) + Align256(nb)};
  RETURN_IF_ERROR(EnsureStaging(offs[5] + (with_o ? nv : 0)));
  uint8_t* base = staging_->data();
  RETURN_IF_ERROR(backend_->CopyIn(base + offs[0], in.q, nq));
  RETURN_IF_ERROR(backend_->CopyIn(base + offs[1], in.k, nq));
  RETURN_IF_ERROR(backend_->CopyIn(base + offs[2], in.v, nv));
  RETURN_IF_ERROR(backend_->CopyIn(base + offs[3], in.g, ng));
  RETURN_IF_ERROR(backend_->CopyIn(base + offs[4], in.beta, nb));
  return Staged{reinterpret_cast<const float*>(base + offs[0]),
                reinterpret_cast<const float*>(base + offs[1]),
                reinterpret_cast<const float*>(base + offs[2]),
                reinterpret_cast<const float*>(base + offs[3]),
                reinterpret_cast<const float*>(base + offs[4]),
                with_o ? reinterpret_cast<float*>(base + offs[5]) : nullptr};
}

absl::Status BackendStateStore::Decode(int layer, const RecurrentInputs& in, float* o) {
  RETURN_IF_ERROR(ValidateRecurrentInputs(geometry(), layer, in));
  if (o == nullptr) return absl::InvalidArgumentError("o: null (decode always reads out)");
  ASSIGN_OR_RETURN(Staged s, Stage(in, /*with_o=*/true));
  const ModelGeometry& g = geometry();
  const int64_t qk = int64_t{g.h_qk} * g.d_k, vv = int64_t{g.h_v} * g.d_v,
                gg = int64_t{g.h_v} * g.GateWidth();
  for (int t = 0; t < in.tokens; ++t) {
    DecodeInputs d;
    d.batch = 1;
    d.slots = reinterpret_cast<const int32_t*>(slot_index_->data());
    d.dtype = DType::kFp32;
    d.q = s.q + t * qk;
    d.k = s.k + t * qk;
    d.v = s.v + t * vv;
    d.g = s.g + t * gg;
    d.beta = s.beta + int64_t{t} * g.h_v;
    d.o = s.o + t * vv;
    RETURN_IF_ERROR(backend_->DecodeUpdate(*prepared_, pool_, layer, d));
  }
  return backend_->CopyOut(o, s.o, int64_t{in.tokens} * vv * 4);
}

absl::Status BackendStateStore::Prefill(int layer, const RecurrentInputs& in, float* o) {
  RETURN_IF_ERROR(ValidateRecurrentInputs(geometry(), layer, in));
  ASSIGN_OR_RETURN(Staged s, Stage(in, /*with_o=*/o != nullptr));
  PrefillInputs p;
  p.batch = 1;
  p.tokens = in.tokens;
  p.slots = reinterpret_cast<const int32_t*>(slot_index_->data());
  p.dtype = DType::kFp32;
  p.q = s.q;
  p.k = s.k;
  p.v = s.v;
  p.g = s.g;
  p.beta = s.beta;
  p.o = s.o;
  RETURN_IF_ERROR(backend_->Prefill(*prepared_, pool_, layer, p));
  if (o == nullptr) return absl::OkStatus();
  const ModelGeometry& g = geometry();
  return backend_->CopyOut(o, s.o, int64_t{in.tokens} * g.h_v * g.d_v * 4);
}

absl::Status BackendStateStore::Reset() {
  return backend_->ZeroSlots(pool_, reinterpret_cast<const int32_t*>(slot_index_->data()), 1);
}

absl::StatusOr<std::vector<float>> BackendStateStore::ReadStates() {
  const int64_t n = StateElements(geometry());
  RETURN_IF_ERROR(EnsureStaging(n * 4));
  RETURN_IF_ERROR(backend_->UnpackStates(*prepared_, pool_,
                                         reinterpret_cast<const int32_t*>(slot_index_->data()), 1,
                                         reinterpret_cast<float*>(staging_->data())));
  std::vector<float> out(static_cast<size_t>(n));
  RETURN_IF_ERROR(backend_->CopyOut(out.data(), staging_->data(), n * 4));
  return out;
}

absl::Status BackendStateStore::WriteStates(const std::vector<float>& states) {
  const int64_t n = StateElements(geometry());
  if (static_cast<int64_t>(states.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("states: ", states.size(), " floats, expected ", n));
  }
  RETURN_IF_ERROR(EnsureStaging(n * 4));
  RETURN_IF_ERROR(backend_->CopyIn(staging_->data(), states.data(), n * 4));
  return backend_->PackStates(*prepared_, pool_,
                              reinterpret_cast<const int32_t*>(slot_index_->data()), 1,
                              reinterpret_cast<const float*>(staging_->data()));
}

absl::StatusOr<std::string> BackendStateStore::ReadSlotBytes() {
  std::string out(static_cast<size_t>(layout_.slot_bytes()), '\0');
  RETURN_IF_ERROR(backend_->CopyOut(&out[0], slot_buffer_->data(), layout_.slot_bytes()));
  return out;
}

}  // namespace statecache
