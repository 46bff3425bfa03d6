#include "client/remote_store/remote_state_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/pool_view.h"
#include "kernels/common/status_macros.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/formats/format.h"

namespace statecache {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

absl::StatusOr<ModelGeometry> GeometryOf(const v1::ModelInfo& info) {
  const v1::Geometry& p = info.geometry();
  if (p.arch() != v1::ARCH_GDN && p.arch() != v1::ARCH_KDA) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", info.model_id(), ": geometry.arch unspecified"));
  }
  ModelGeometry g;
  g.arch = p.arch() == v1::ARCH_KDA ? Arch::kKda : Arch::kGdn;
  g.layers = p.layers();
  g.h_qk = p.h_qk();
  g.h_v = p.h_v();
  g.d_k = p.d_k();
  g.d_v = p.d_v();
  g.scale = p.scale();
  return g;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteStateStore>> RemoteStateStore::Create(
    StateCacheClient* client, std::string model_id, Options options) {
  if (client == nullptr) return absl::InvalidArgumentError("client: null");
  if (options.pipeline < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.pipeline: ", options.pipeline, " (must be >= 1)"));
  }
  std::unique_ptr<RemoteStateStore> s(
      new RemoteStateStore(client, std::move(model_id), std::move(options)));
  ASSIGN_OR_RETURN(s->info_, client->DescribeModel(s->model_id_));
  ASSIGN_OR_RETURN(s->geometry_, GeometryOf(s->info_));
  if (s->options_.layout.has_value()) {
    const StateLayout& l = *s->options_.layout;
    if (l.Fingerprint() != s->info_.tags().layout_fingerprint()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "options.layout: fingerprint ", absl::Hex(l.Fingerprint(), absl::kZeroPad16),
          " differs from model ", s->model_id_, "'s ",
          absl::Hex(s->info_.tags().layout_fingerprint(), absl::kZeroPad16)));
    }
  }
  ASSIGN_OR_RETURN(std::vector<SlotHandle> slots, client->AllocateSlots(s->model_id_, 1));
  s->slot_ = slots[0];
  s->has_slot_ = true;
  return s;
}

RemoteStateStore::~RemoteStateStore() {
  if (stream_ != nullptr) (void)stream_->Finish();
  if (has_slot_) (void)client_->ReleaseSlots(model_id_, {slot_});
}

std::string RemoteStateStore::Describe() const {
  return absl::StrCat("statecached model ", model_id_, ", ", info_.format(),
                      info_.identity_layout() ? " (identity layout)" : " (calibrated layout)",
                      ", ", info_.slot_bytes(), " bytes/sequence, slot ", slot_.DebugString());
}

UpdateCall RemoteStateStore::TokenCall(int layer, const RecurrentInputs& in, int t) const {
  const ModelGeometry& g = geometry_;
  const int64_t qk = int64_t{g.h_qk} * g.d_k, vv = int64_t{g.h_v} * g.d_v,
                gg = int64_t{g.h_v} * g.GateWidth();
  UpdateCall c;
  c.layer = layer;
  c.slots = {slot_};
  c.q = HostTensor::Fp32(absl::MakeConstSpan(in.q + t * qk, qk));
  c.k = HostTensor::Fp32(absl::MakeConstSpan(in.k + t * qk, qk));
  c.v = HostTensor::Fp32(absl::MakeConstSpan(in.v + t * vv, vv));
  c.g = absl::MakeConstSpan(in.g + t * gg, gg);
  c.beta = absl::MakeConstSpan(in.beta + int64_t{t} * g.h_v, g.h_v);
  return c;
}

absl::Status RemoteStateStore::Decode(int layer, const RecurrentInputs& in, float* o) {
  RETURN_IF_ERROR(ValidateRecurrentInputs(geometry_, layer, in));
  if (o == nullptr) return absl::InvalidArgumentError("o: null (decode always reads out)");
  if (!has_slot_) return absl::FailedPreconditionError("slot: none (a Reset failed)");
  return options_.use_stream ? DecodeStream(layer, in, o) : DecodeUnary(layer, in, o);
}

absl::Status RemoteStateStore::DecodeUnary(int layer, const RecurrentInputs& in, float* o) {
  const int64_t vv = int64_t{geometry_.h_v} * geometry_.d_v;
  for (int t = 0; t < in.tokens; ++t) {
    const Clock::time_point start = Clock::now();
    ASSIGN_OR_RETURN(std::vector<float> out, client_->Update(model_id_, TokenCall(layer, in, t)));
    if (options_.record_latency) update_micros_.push_back(MicrosSince(start));
    if (static_cast<int64_t>(out.size()) != vv) {
      return absl::InternalError(absl::StrCat("Update: o has ", out.size(), " floats, expected ", vv));
    }
    std::memcpy(o + t * vv, out.data(), vv * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status RemoteStateStore::DecodeStream(int layer, const RecurrentInputs& in, float* o) {
  if (stream_ == nullptr) {
    ASSIGN_OR_RETURN(stream_, client_->OpenUpdateStream());
  }
  const int64_t vv = int64_t{geometry_.h_v} * geometry_.d_v;
  // Requests are answered in order; keep at most `pipeline` in flight.
  std::deque<std::pair<uint64_t, Clock::time_point>> in_flight;
  int sent = 0, received = 0;
  absl::Status status;
  // Sequence numbers are local to this call: t + 1.
  while (received < in.tokens) {
    while (sent < in.tokens && static_cast<int>(in_flight.size()) < options_.pipeline) {
      // The round trip starts before Send: a synchronous stream Write may
      // return only after the server has consumed the request.
      const Clock::time_point sent_at = Clock::now();
      status = stream_->Send(model_id_, TokenCall(layer, in, sent), sent + 1);
      if (!status.ok()) break;
      in_flight.emplace_back(sent + 1, sent_at);
      ++sent;
    }
    if (!status.ok()) break;
    absl::StatusOr<UpdateStream::Response> r = stream_->Receive();
    if (!r.ok()) {
      status = r.status();
      break;
    }
    const auto [want_seq, start] = in_flight.front();
    in_flight.pop_front();
    if (r->sequence != want_seq) {
      status = absl::InternalError(absl::StrCat("UpdateStream: response ", r->sequence,
                                                " answers a different request than ", want_seq));
      break;
    }
    if (!r->o.ok()) {
      status = r->o.status();
      break;
    }
    if (options_.record_latency) update_micros_.push_back(MicrosSince(start));
    if (static_cast<int64_t>(r->o->size()) != vv) {
      status = absl::InternalError(
          absl::StrCat("UpdateStream: o has ", r->o->size(), " floats, expected ", vv));
      break;
    }
    std::memcpy(o + int64_t{received} * vv, r->o->data(), vv * sizeof(float));
    ++received;
  }
  if (!status.ok()) {
    // Responses of requests still in flight would be misattributed to the
    // next call: drop the stream (the next call opens a new one).
    if (!in_flight.empty() || absl::IsUnavailable(status) || absl::IsInternal(status)) {
      stream_.reset();
    }
    return status;
  }
  return absl::OkStatus();
}

absl::Status RemoteStateStore::Prefill(int layer, const RecurrentInputs& in, float* o) {
  RETURN_IF_ERROR(ValidateRecurrentInputs(geometry_, layer, in));
  if (!has_slot_) return absl::FailedPreconditionError("slot: none (a Reset failed)");
  const ModelGeometry& g = geometry_;
  const int64_t T = in.tokens;
  const int64_t qk = T * g.h_qk * g.d_k, vv = T * g.h_v * g.d_v, gg = T * g.h_v * g.GateWidth();
  PrefillCall c;
  c.layer = layer;
  c.tokens = in.tokens;
  c.slots = {slot_};
  c.q = HostTensor::Fp32(absl::MakeConstSpan(in.q, qk));
  c.k = HostTensor::Fp32(absl::MakeConstSpan(in.k, qk));
  c.v = HostTensor::Fp32(absl::MakeConstSpan(in.v, vv));
  c.g = absl::MakeConstSpan(in.g, gg);
  c.beta = absl::MakeConstSpan(in.beta, T * g.h_v);
  c.want_output = o != nullptr;
  ASSIGN_OR_RETURN(std::vector<float> out, client_->Prefill(model_id_, c));
  if (o == nullptr) return absl::OkStatus();
  if (static_cast<int64_t>(out.size()) != vv) {
    return absl::InternalError(absl::StrCat("Prefill: o has ", out.size(), " floats, expected ", vv));
  }
  std::memcpy(o, out.data(), vv * sizeof(float));
  return absl::OkStatus();
}

absl::Status RemoteStateStore::Reset() {
  if (has_slot_) {
    RETURN_IF_ERROR(client_->ReleaseSlots(model_id_, {slot_}));
    has_slot_ = false;
  }
  ASSIGN_OR_RETURN(std::vector<SlotHandle> slots, client_->AllocateSlots(model_id_, 1));
  slot_ = slots[0];
  has_slot_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> RemoteStateStore::ReadStates() {
  if (!options_.layout.has_value()) {
    return absl::FailedPreconditionError(
        "ReadStates: needs Options::layout (the layout the model was registered with)");
  }
  if (!has_slot_) return absl::FailedPreconditionError("slot: none (a Reset failed)");
  const StateLayout& layout = *options_.layout;
  ASSIGN_OR_RETURN(ExportedState exported, client_->Export(model_id_, slot_));
  if (static_cast<int64_t>(exported.packed.size()) != layout.slot_bytes()) {
    return absl::DataLossError(absl::StrCat("Export: ", exported.packed.size(),
                                            " packed bytes, expected ", layout.slot_bytes()));
  }
  // Unpack with the CPU reference in process.
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> cpu, CreateBackend("cpu"));
  ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> prepared, cpu->Prepare(layout));
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> slot, cpu->Allocate(layout.slot_bytes()));
  RETURN_IF_ERROR(cpu->CopyIn(slot->data(), exported.packed.data(), layout.slot_bytes()));
  const int64_t n = StateElements(geometry_);
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> states, cpu->Allocate(n * 4));
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> index, cpu->Allocate(sizeof(int32_t)));
  const int32_t zero = 0;
  RETURN_IF_ERROR(cpu->CopyIn(index->data(), &zero, sizeof(zero)));
  PoolView pool;
  pool.base = slot->data();
  pool.num_slots = 1;
  pool.layers = geometry_.layers;
  pool.heads = geometry_.h_v;
  pool.head_bytes = layout.head_layout().head_bytes;
  RETURN_IF_ERROR(cpu->UnpackStates(*prepared, pool,
                                    reinterpret_cast<const int32_t*>(index->data()), 1,
                                    reinterpret_cast<float*>(states->data())));
  std::vector<float> out(static_cast<size_t>(n));
  RETURN_IF_ERROR(cpu->CopyOut(out.data(), states->data(), n * 4));
  return out;
}

absl::Status RemoteStateStore::WriteStates(const std::vector<float>& states) {
  const int64_t n = StateElements(geometry_);
  if (static_cast<int64_t>(states.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("states: ", states.size(), " floats, expected ", n));
  }
  if (!has_slot_) return absl::FailedPreconditionError("slot: none (a Reset failed)");
  return client_->PrefillStates(model_id_, {slot_}, states);
}

absl::StatusOr<PrefixKey> RemoteStateStore::Snapshot(absl::Span<const int32_t> tokens,
                                                     const std::vector<std::string>& aux) {
  if (!has_slot_) return absl::FailedPreconditionError("slot: none (a Reset failed)");
  return client_->Snapshot(model_id_, slot_, tokens, aux);
}

absl::StatusOr<std::optional<RemoteStateStore::Restored>> RemoteStateStore::RestoreLongestPrefix(
    absl::Span<const int32_t> tokens) {
  if (!has_slot_) return absl::FailedPreconditionError("slot: none (a Reset failed)");
  ASSIGN_OR_RETURN(PrefixLookup lookup, client_->LookupPrefix(model_id_, tokens));
  if (!lookup.hit) return std::optional<Restored>();
  ASSIGN_OR_RETURN(RestoredCheckpoint r,
                   client_->Restore(model_id_, slot_, lookup.key, lookup.lease_id));
  return std::optional<Restored>(Restored{lookup.key, std::move(r.aux)});
}

std::vector<std::string> SessionAux(const ModelSession& session) {
  std::vector<std::string> aux;
  const int layers = session.store()->geometry().layers;
  aux.reserve(layers);
  for (int l = 0; l < layers; ++l) aux.push_back(session.ExportConvState(l).value());
  return aux;
}

absl::StatusOr<PrefixKey> SnapshotSession(const ModelSession& session, RemoteStateStore& store,
                                          absl::Span<const int32_t> tokens) {
  if (session.store() != &store) {
    return absl::InvalidArgumentError("session: runs on another store");
  }
  return store.Snapshot(tokens, SessionAux(session));
}

absl::StatusOr<RestoreOutcome> RestoreSession(ModelSession& session, RemoteStateStore& store,
                                              absl::Span<const int32_t> tokens) {
  if (session.store() != &store) {
    return absl::InvalidArgumentError("session: runs on another store");
  }
  ASSIGN_OR_RETURN(std::optional<RemoteStateStore::Restored> r, store.RestoreLongestPrefix(tokens));
  RestoreOutcome out;
  if (!r.has_value()) {
    RETURN_IF_ERROR(session.Reset());
    return out;
  }
  const int layers = store.geometry().layers;
  if (static_cast<int>(r->aux.size()) != layers) {
    return absl::DataLossError(absl::StrCat("checkpoint of ", r->key.num_tokens, " tokens has ",
                                            r->aux.size(), " aux entries, expected ", layers,
                                            " (conv windows; snapshotted without them?)"));
  }
  for (int l = 0; l < layers; ++l) {
    absl::Status s = session.ImportConvState(l, r->aux[l]);
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint aux[", l, "]: ", s.message()));
    }
  }
  out.hit = true;
  out.restored_tokens = r->key.num_tokens;
  return out;
}

}  // namespace statecache
