#include "server/dataplane/data_plane.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/backend/interprocess.h"
#include "kernels/common/status_macros.h"
#include "kernels/formats/format.h"
#include "server/core/log.h"
#include "server/ops/checks.h"
#include "server/pool/staging.h"
#include "server/core/proto_convert.h"

namespace statecache {
namespace {

constexpr int64_t kRefAlign = 16;

// A registered buffer: the worker's memory mapped through the backend's
// Interprocess capability, with the events that order the two processes'
// accesses when the capability uses them (worker_event: optional, waited
// for before reading; server_event: recorded after writing).
class MappedBuffer : public DataPlane::Buffer {
 public:
  MappedBuffer(Interprocess* ipc, std::unique_ptr<InterprocessBuffer> memory,
               std::unique_ptr<InterprocessEvent> worker_event,
               std::unique_ptr<InterprocessEvent> server_event)
      : ipc_(ipc),
        memory_(std::move(memory)),
        worker_event_(std::move(worker_event)),
        server_event_(std::move(server_event)) {}
  uint8_t* data() const override { return memory_->data(); }
  int64_t size() const override { return memory_->size(); }
  absl::Status BeforeRead() override {
    if (worker_event_ == nullptr) return absl::OkStatus();
    return worker_event_->Synchronize();
  }
  absl::Status AfterWrite() override {
    if (server_event_ == nullptr) return absl::OkStatus();
    return server_event_->Record(nullptr);
  }
  std::string server_event_handle() const override {
    return server_event_ == nullptr ? "" : server_event_->handle();
  }
  absl::Status StoreWord(int64_t offset, uint64_t value, void* stream) override {
    return ipc_->StoreWord(memory_->data() + offset, value, stream);
  }

 private:
  Interprocess* const ipc_;
  const std::unique_ptr<InterprocessBuffer> memory_;
  const std::unique_ptr<InterprocessEvent> worker_event_;
  const std::unique_ptr<InterprocessEvent> server_event_;
};

// The worker's memory of a RegisterBuffer: its handle field (by the
// capability's transport) checked and mapped, its events opened / made.
absl::StatusOr<std::shared_ptr<DataPlane::Buffer>> OpenRegistered(
    Interprocess& ipc, const v1::RegisterBufferRequest& req) {
  const bool cuda_ipc = ipc.transport() == Interprocess::Transport::kCudaIpc;
  if (cuda_ipc && req.memory_case() != v1::RegisterBufferRequest::kCudaIpcHandle) {
    return absl::InvalidArgumentError(
        "cuda_ipc_handle: the CUDA backend maps CUDA IPC memory handles (set cuda_ipc_handle)");
  }
  if (!cuda_ipc && req.memory_case() != v1::RegisterBufferRequest::kShmName) {
    return absl::InvalidArgumentError(
        "shm_name: the CPU backend maps POSIX shared-memory objects (set shm_name)");
  }
  const std::string& handle = cuda_ipc ? req.cuda_ipc_handle() : req.shm_name();
  const int handle_bytes = ipc.handle_bytes();
  if (handle_bytes > 0 && (static_cast<int>(handle.size()) != handle_bytes ||
                           (!req.cuda_ipc_event().empty() &&
                            static_cast<int>(req.cuda_ipc_event().size()) != handle_bytes))) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc_handle: handles are ", handle_bytes, " bytes"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<InterprocessBuffer> memory,
                   ipc.Open(handle, req.size_bytes(), /*unlink_name=*/true,
                            cuda_ipc ? "cuda_ipc_handle" : "shm_name"));
  std::unique_ptr<InterprocessEvent> worker_event, server_event;
  if (ipc.uses_events()) {
    if (!req.cuda_ipc_event().empty()) {
      ASSIGN_OR_RETURN(worker_event, ipc.OpenEvent(req.cuda_ipc_event(), "cuda_ipc_event"));
    }
    ASSIGN_OR_RETURN(server_event, ipc.CreateEvent());
  }
  return std::make_shared<MappedBuffer>(&ipc, std::move(memory), std::move(worker_event),
                                        std::move(server_event));
}

}  // namespace

DataPlane::DataPlane(Backend* backend, ModelRegistry* registry, Options options)
    : backend_(backend),
      registry_(registry),
      options_(options),
      ipc_(backend->interprocess()),
      host_readable_(ipc_ != nullptr ? ipc_->host_accessible() : backend->host_memory()) {
  if (options_.sweep_period > absl::ZeroDuration()) {
    sweeper_ = std::make_unique<std::thread>([this] {
      absl::MutexLock lock(&sweeper_mu_);
      while (!sweeper_mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.sweep_period)) {
        sweeper_mu_.Unlock();
        ExpireSessions(absl::Now());
        sweeper_mu_.Lock();
      }
    });
  }
}

DataPlane::~DataPlane() {
  if (sweeper_ != nullptr) {
    {
      absl::MutexLock lock(&sweeper_mu_);
      stop_ = true;
    }
    sweeper_->join();
  }
  std::vector<std::unique_ptr<Attachment>> detached;
  std::vector<std::shared_ptr<Buffer>> released;
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  for (uint64_t id : ids) EndSessionLocked(id, &detached, &released);
}

uint64_t DataPlane::NewIdLocked() {
  uint64_t id;
  do {
    id = absl::Uniform<uint64_t>(bitgen_);
  } while (id == 0 || sessions_.contains(id) || buffers_.contains(id));
  return id;
}

absl::StatusOr<DataPlane::Session*> DataPlane::FindSessionLocked(const std::string& tenant,
                                                                uint64_t id,
                                                                absl::string_view field) {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.tenant != tenant) {
    return absl::NotFoundError(
        absl::StrCat(field, ": no data-plane session ", id, " (closed, expired or unknown)"));
  }
  it->second.last_used = absl::Now();
  return &it->second;
}

void DataPlane::EndSessionLocked(uint64_t id, std::vector<std::unique_ptr<Attachment>>* detached,
                                 std::vector<std::shared_ptr<Buffer>>* released) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  for (uint64_t b : it->second.buffers) {
    auto bit = buffers_.find(b);
    if (bit != buffers_.end()) {
      released->push_back(std::move(bit->second.buffer));
      buffers_.erase(bit);
    }
  }
  for (auto& a : it->second.attachments) {
    for (uint64_t h : a->ids) attached_.erase({a->model.get(), h});
    detached->push_back(std::move(a));
  }
  sessions_.erase(it);
}

absl::Status DataPlane::OpenSession(const std::string& tenant, const v1::OpenSessionRequest& req,
                                    v1::OpenSessionResponse* resp) {
  if (req.lease_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ms: ", req.lease_ms(), " is negative"));
  }
  absl::Duration lease = req.lease_ms() == 0 ? options_.default_lease
                                             : absl::Milliseconds(req.lease_ms());
  lease = std::min(lease, options_.max_lease);
  absl::MutexLock lock(&mu_);
  uint64_t id = req.session_id();
  if (id != 0) {
    ASSIGN_OR_RETURN(Session * s, FindSessionLocked(tenant, id, "session_id"));
    if (req.lease_ms() != 0) s->lease = lease;
    lease = s->lease;
  } else {
    id = NewIdLocked();
    Session& s = sessions_[id];
    s.id = id;
    s.tenant = tenant;
    s.lease = lease;
    s.last_used = absl::Now();
  }
  resp->set_session_id(id);
  resp->set_lease_ms(absl::ToInt64Milliseconds(lease));
  resp->set_backend(backend_->name());
  return absl::OkStatus();
}

absl::Status DataPlane::CloseSession(const std::string& tenant,
                                     const v1::CloseSessionRequest& req) {
  std::vector<std::unique_ptr<Attachment>> detached;
  std::vector<std::shared_ptr<Buffer>> released;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(FindSessionLocked(tenant, req.session_id(), "session_id").status());
    EndSessionLocked(req.session_id(), &detached, &released);
  }
  LogEvent("dataplane_session_closed",
           absl::StrCat("session=", req.session_id(), " buffers=", released.size(),
                        " attachments=", detached.size()));
  return absl::OkStatus();  // mappings and slot accesses released outside the lock
}

int64_t DataPlane::ExpireSessions(absl::Time now) {
  std::vector<std::unique_ptr<Attachment>> detached;
  std::vector<std::shared_ptr<Buffer>> released;
  int64_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> expired;
    for (const auto& [id, s] : sessions_) {
      if (s.last_used + s.lease < now) expired.push_back(id);
    }
    for (uint64_t id : expired) EndSessionLocked(id, &detached, &released);
    n = static_cast<int64_t>(expired.size());
  }
  if (n > 0) {
    LogEvent("dataplane_session_expired", absl::StrCat("sessions=", n, " buffers=",
                                                       released.size(), " attachments=",
                                                       detached.size()));
  }
  return n;
}

absl::Status DataPlane::RegisterBuffer(const std::string& tenant,
                                       const v1::RegisterBufferRequest& req,
                                       v1::RegisterBufferResponse* resp) {
  if (req.size_bytes() < 1 || req.size_bytes() > options_.max_buffer_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("size_bytes: ", req.size_bytes(),
                                                   " is outside 1..", options_.max_buffer_bytes));
  }
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Session * s, FindSessionLocked(tenant, req.session_id(), "session_id"));
    if (static_cast<int>(s->buffers.size()) >= options_.max_buffers_per_session) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session_id: ", s->buffers.size(), " buffers registered, the limit per session"));
    }
  }
  if (ipc_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session_id: the ", backend_->name(), " backend shares no memory with other processes"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, OpenRegistered(*ipc_, req));
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    // The session may have ended meanwhile.
    ASSIGN_OR_RETURN(Session * s, FindSessionLocked(tenant, req.session_id(), "session_id"));
    id = NewIdLocked();
    s->buffers.push_back(id);
    buffers_[id] = BufferEntry{buffer, tenant, s->id};
  }
  resp->set_buffer_id(id);
  if (ipc_->uses_events()) resp->set_cuda_ipc_event(buffer->server_event_handle());
  LogEvent("dataplane_buffer_registered",
           absl::StrCat("session=", req.session_id(), " buffer=", id, " bytes=", req.size_bytes()));
  return absl::OkStatus();
}

absl::Status DataPlane::ReleaseBuffer(const std::string& tenant,
                                      const v1::ReleaseBufferRequest& req) {
  std::shared_ptr<Buffer> released;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Session * s, FindSessionLocked(tenant, req.session_id(), "session_id"));
  auto it = std::find(s->buffers.begin(), s->buffers.end(), req.buffer_id());
  if (it == s->buffers.end()) {
    return absl::NotFoundError(
        absl::StrCat("buffer_id: no buffer ", req.buffer_id(), " in this session"));
  }
  s->buffers.erase(it);
  released = std::move(buffers_[req.buffer_id()].buffer);
  buffers_.erase(req.buffer_id());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DataPlane::Buffer>> DataPlane::FindBuffer(const std::string& tenant,
                                                                        uint64_t id,
                                                                        absl::string_view field) {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end() || it->second.tenant != tenant) {
    return absl::NotFoundError(absl::StrCat(field, ".buffer_id: no registered buffer ", id));
  }
  auto s = sessions_.find(it->second.session);
  if (s != sessions_.end()) s->second.last_used = absl::Now();
  return it->second.buffer;
}

absl::Status DataPlane::AttachSlots(const std::string& tenant, const v1::AttachSlotsRequest& req,
                                    v1::AttachSlotsResponse* resp) {
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(FindSessionLocked(tenant, req.session_id(), "session_id").status());
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(tenant, req.model_id()));
  if (IsStepQuantFormat(m->layout.format().format)) {
    return absl::UnimplementedError(
        "model_id: attached mode does not support stepquant-* layouts yet");
  }
  const std::vector<SlotHandle> handles = HandlesFromProto(req.slots());
  if (handles.empty()) return absl::InvalidArgumentError("slots: no slot handles given");
  if (ipc_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model_id: the ", backend_->name(), " backend shares no memory with other processes"));
  }
  absl::StatusOr<std::string> arena = ipc_->Export(m->slots->arena());
  if (arena.status().code() == absl::StatusCode::kFailedPrecondition) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model_id: the slot arena of '", m->id,
        "' is not in shared memory; start statecached with --shared_pools to attach"));
  }
  RETURN_IF_ERROR(arena.status());
  if (ipc_->transport() == Interprocess::Transport::kCudaIpc) {
    resp->set_cuda_ipc_handle(*std::move(arena));
  } else {
    resp->set_shm_name(*std::move(arena));
  }
  RETURN_IF_ERROR(CheckNotAttached(*m, handles, "slots"));
  // Waits for in-flight calls on the slots; afterwards nothing server-side
  // touches them until the attachment ends.
  ASSIGN_OR_RETURN(SlotPool::SlotAccess access, m->slots->Acquire(handles, "slots"));
  auto a = std::make_unique<Attachment>();
  a->model = m;
  a->handles = handles;
  for (const SlotHandle& h : handles) a->ids.push_back(h.id);
  for (int32_t i : access.indices()) resp->add_slot_indices(i);
  a->access = std::make_unique<SlotPool::SlotAccess>(std::move(access));
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Session * s, FindSessionLocked(tenant, req.session_id(), "session_id"));
    for (size_t i = 0; i < a->ids.size(); ++i) {
      if (attached_.contains({m.get(), a->ids[i]})) {
        return absl::FailedPreconditionError(
            absl::StrCat("slots[", i, "]: already attached by a data-plane session"));
      }
    }
    for (uint64_t h : a->ids) attached_[{m.get(), h}] = s->id;
    resp->set_lease_ms(absl::ToInt64Milliseconds(s->lease));
    s->attachments.push_back(std::move(a));
  }
  TagsToProto(m->id, m->layout, resp->mutable_tags());
  const StateLayout& l = m->layout;
  if (!l.identity_key_perm()) {
    *resp->mutable_layout()->mutable_key_perm() = {l.all_key_perms().begin(),
                                                   l.all_key_perms().end()};
  }
  if (l.format().format == StateFormat::kDampSr) {
    *resp->mutable_layout()->mutable_value_order() = {l.all_value_orders().begin(),
                                                      l.all_value_orders().end()};
    *resp->mutable_layout()->mutable_value_scale() = {l.all_value_scales().begin(),
                                                      l.all_value_scales().end()};
  }
  resp->set_num_slots(m->slots->capacity());
  resp->set_head_bytes(m->slots->view().head_bytes);
  LogEvent("dataplane_attached", absl::StrCat("session=", req.session_id(), " model=", m->id,
                                              " slots=", handles.size()));
  return absl::OkStatus();
}

absl::Status DataPlane::DetachSlots(const std::string& tenant, const v1::DetachSlotsRequest& req) {
  ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry_->Find(tenant, req.model_id()));
  std::vector<std::unique_ptr<Attachment>> detached;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Session * s, FindSessionLocked(tenant, req.session_id(), "session_id"));
  std::vector<uint64_t> want;
  for (int i = 0; i < req.slots_size(); ++i) {
    auto it = attached_.find({m.get(), req.slots(i).id()});
    if (it == attached_.end() || it->second != s->id) {
      return absl::FailedPreconditionError(
          absl::StrCat("slots[", i, "]: not attached by this session"));
    }
    want.push_back(req.slots(i).id());
  }
  // Attachments are all or nothing: detach every attachment that holds one of
  // the slots; slots of it not named are re-attached by the caller if needed.
  for (auto it = s->attachments.begin(); it != s->attachments.end();) {
    const Attachment& a = **it;
    const bool hit = a.model == m && std::any_of(a.ids.begin(), a.ids.end(), [&](uint64_t id) {
                       return std::find(want.begin(), want.end(), id) != want.end();
                     });
    if (hit) {
      for (uint64_t h : a.ids) attached_.erase({m.get(), h});
      detached.push_back(std::move(*it));
      it = s->attachments.erase(it);
    } else {
      ++it;
    }
  }
  return absl::OkStatus();
}

absl::Status DataPlane::CheckNotAttached(const Model& model, absl::Span<const SlotHandle> handles,
                                         absl::string_view field) const {
  absl::MutexLock lock(&mu_);
  if (attached_.empty()) return absl::OkStatus();
  for (size_t i = 0; i < handles.size(); ++i) {
    if (attached_.contains({&model, handles[i].id})) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, "[", i, "]: the slot is attached to a data-plane session (attached mode); "
          "only that worker may update it until DetachSlots"));
    }
  }
  return absl::OkStatus();
}

int64_t DataPlane::session_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sessions_.size());
}
int64_t DataPlane::buffer_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(buffers_.size());
}
int64_t DataPlane::attached_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(attached_.size());
}

// ---------------------------------------------------------------------------
// Compute with references

bool DataPlane::UsesBuffers(const v1::UpdateRequest& r) {
  return r.has_o_ref() || r.q().has_ref() || r.k().has_ref() || r.v().has_ref() ||
         r.g().has_ref() || r.beta().has_ref();
}

bool DataPlane::UsesBuffers(const v1::PrefillRequest& r) {
  if (r.input_case() == v1::PrefillRequest::kStates) return r.states().has_ref();
  const v1::PrefillTokens& t = r.tokens();
  return t.has_o_ref() || t.q().has_ref() || t.k().has_ref() || t.v().has_ref() ||
         t.g().has_ref() || t.beta().has_ref();
}

absl::StatusOr<DataPlane::Resolved> DataPlane::ResolveRef(const std::string& tenant,
                                                         const v1::BufferRef& ref,
                                                         absl::string_view field, DType dtype,
                                                         int64_t count) {
  // "q" -> "q.ref"; fields that are references themselves ("open.done_ref")
  // keep their name.
  const std::string f =
      absl::EndsWith(field, "_ref") ? std::string(field) : absl::StrCat(field, ".ref");
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, FindBuffer(tenant, ref.buffer_id(), f));
  const int64_t bytes = count * DTypeSize(dtype);
  const int64_t off = ref.offset();
  if (off < 0 || off % kRefAlign != 0 || off > buffer->size() || bytes > buffer->size() - off) {
    return absl::InvalidArgumentError(absl::StrCat(
        f, ": bytes [", off, ", ", off + bytes, ") are outside the registered buffer of ",
        buffer->size(), " bytes (offsets must be >= 0 and multiples of ", kRefAlign, ")"));
  }
  Resolved r;
  r.dtype = dtype;
  r.data = buffer->data() + off;
  r.bytes = bytes;
  r.buffer = std::move(buffer);
  return r;
}

absl::StatusOr<DataPlane::Resolved> DataPlane::Resolve(const std::string& tenant,
                                                      const v1::Tensor& t, absl::string_view field,
                                                      absl::Span<const DType> allowed,
                                                      absl::Span<const int64_t> shape) {
  if (t.payload_case() != v1::Tensor::kRef) {
    ASSIGN_OR_RETURN(TensorBytes tb, CheckTensor(t, field, allowed, shape));
    Resolved r;
    r.dtype = tb.dtype;
    r.bytes = tb.bytes;
    ASSIGN_OR_RETURN(r.staged, StageBytes(*backend_, tb.data, tb.bytes));
    r.data = r.staged->data();
    return r;
  }
  ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(t.dtype(), absl::StrCat(field, ".dtype")));
  if (std::find(allowed.begin(), allowed.end(), dtype) == allowed.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dtype: ", DTypeName(dtype), " is not allowed here"));
  }
  const std::vector<int64_t> got(t.shape().begin(), t.shape().end());
  if (!std::equal(got.begin(), got.end(), shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: ", ShapeString(got), ", want ", ShapeString(shape)));
  }
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return ResolveRef(tenant, t.ref(), field, dtype, count);
}

absl::StatusOr<DataPlane::Resolved> DataPlane::ResolveOutput(const std::string& tenant,
                                                            bool has_ref, const v1::BufferRef& ref,
                                                            absl::string_view field,
                                                            int64_t count) {
  if (has_ref) return ResolveRef(tenant, ref, field, DType::kFp32, count);
  Resolved r;
  r.bytes = count * 4;
  ASSIGN_OR_RETURN(r.staged, backend_->Allocate(std::max<int64_t>(r.bytes, 256)));
  r.data = r.staged->data();
  return r;
}

absl::StatusOr<std::shared_ptr<BackendBuffer>> DataPlane::StagedIndices(
    const std::vector<int32_t>& idx) {
  constexpr size_t kMaxCached = 256;
  {
    absl::MutexLock lock(&index_mu_);
    auto it = index_cache_.find(idx);
    if (it != index_cache_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> staged, StageInts(*backend_, idx));
  std::shared_ptr<BackendBuffer> shared = std::move(staged);
  absl::MutexLock lock(&index_mu_);
  if (index_cache_.size() >= kMaxCached) index_cache_.clear();  // holders keep theirs
  index_cache_[idx] = shared;
  return shared;
}

absl::Status DataPlane::HostValueCheck(const ops::Limits& limits, absl::string_view prefix,
                                       const Resolved& q, const Resolved& k, const Resolved& v,
                                       int d_k) const {
  // Device memory (CUDA) is not host-readable. Inline tensors of a mixed
  // request are staged in backend memory too, so all three are checked here.
  if (!host_readable_) return absl::OkStatus();
  auto view = [](const Resolved& r) {
    const int64_t width = DTypeSize(r.dtype);
    return TensorBytes{r.dtype, r.data, r.bytes / width, r.bytes};
  };
  return CheckMagnitudes(prefix, view(q), view(k), view(v), d_k, limits.max_abs_value);
}

}  // namespace statecache
