#include "client/cpp/dataplane_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/formats/format.h"

namespace statecache {
namespace {

v1::DType ProtoDType(DType d) {
  switch (d) {
    case DType::kFp32: return v1::DTYPE_FP32;
    case DType::kBf16: return v1::DTYPE_BF16;
    case DType::kFp16: return v1::DTYPE_FP16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::Status SetRef(const BufferTensor& t, std::initializer_list<int64_t> shape,
                    absl::string_view field, v1::Tensor* out) {
  if (t.buffer == nullptr) return absl::InvalidArgumentError(absl::StrCat(field, ": no buffer"));
  out->set_dtype(ProtoDType(t.dtype));
  for (int64_t d : shape) out->add_shape(d);
  out->mutable_ref()->set_buffer_id(t.buffer->id());
  out->mutable_ref()->set_offset(t.offset);
  return absl::OkStatus();
}

// The request of `c` (everything but model_id).
absl::Status FillRefUpdate(const ModelGeometry& g, const RefUpdateCall& c, v1::UpdateRequest* req) {
  const int64_t b = static_cast<int64_t>(c.slots.size());
  req->set_layer(c.layer);
  for (const SlotHandle& h : c.slots) {
    v1::SlotHandle* p = req->add_slots();
    p->set_id(h.id);
    p->set_generation(h.generation);
  }
  RETURN_IF_ERROR(SetRef(c.q, {b, g.h_qk, g.d_k}, "q", req->mutable_q()));
  RETURN_IF_ERROR(SetRef(c.k, {b, g.h_qk, g.d_k}, "k", req->mutable_k()));
  RETURN_IF_ERROR(SetRef(c.v, {b, g.h_v, g.d_v}, "v", req->mutable_v()));
  if (g.arch == Arch::kKda) {
    RETURN_IF_ERROR(SetRef(c.g, {b, g.h_v, g.d_k}, "g", req->mutable_g()));
  } else {
    RETURN_IF_ERROR(SetRef(c.g, {b, g.h_v}, "g", req->mutable_g()));
  }
  RETURN_IF_ERROR(SetRef(c.beta, {b, g.h_v}, "beta", req->mutable_beta()));
  if (c.o.buffer == nullptr) return absl::InvalidArgumentError("o: no buffer");
  req->mutable_o_ref()->set_buffer_id(c.o.buffer->id());
  req->mutable_o_ref()->set_offset(c.o.offset);
  return absl::OkStatus();
}

int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------------------
// WorkerBuffer

WorkerBuffer::~WorkerBuffer() = default;

absl::Status WorkerBuffer::Write(int64_t offset, const void* host, int64_t bytes) {
  if (offset < 0 || bytes < 0 || offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("offset: [", offset, ", ", offset + bytes,
                                                   ") is outside the buffer of ", size_));
  }
  RETURN_IF_ERROR(memory_->Write(offset, host, bytes));
  return MarkWritten();
}

absl::Status WorkerBuffer::MarkWritten() {
  if (worker_event_ == nullptr) return absl::OkStatus();
  return worker_event_->Record(nullptr);
}

absl::Status WorkerBuffer::Read(int64_t offset, void* host, int64_t bytes) const {
  if (offset < 0 || bytes < 0 || offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("offset: [", offset, ", ", offset + bytes,
                                                   ") is outside the buffer of ", size_));
  }
  if (server_event_ != nullptr) RETURN_IF_ERROR(server_event_->Synchronize());
  return memory_->Read(offset, host, bytes);
}

// ---------------------------------------------------------------------------
// DataPlaneSession

absl::StatusOr<std::unique_ptr<DataPlaneSession>> DataPlaneSession::Open(StateCacheClient* client,
                                                                         absl::Duration lease) {
  v1::OpenSessionRequest req;
  req.set_lease_ms(absl::ToInt64Milliseconds(lease));
  v1::OpenSessionResponse resp;
  grpc::ClientContext ctx;
  client->PrepareContext(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(client->stub().OpenSession(&ctx, req, &resp)));
  auto s = std::unique_ptr<DataPlaneSession>(new DataPlaneSession(client));
  s->id_ = resp.session_id();
  s->backend_ = resp.backend();
  ASSIGN_OR_RETURN(s->interprocess_, CreateInterprocess(s->backend_));
  s->lease_ = absl::Milliseconds(resp.lease_ms());
  return s;
}

DataPlaneSession::~DataPlaneSession() { Close().IgnoreError(); }

absl::Status DataPlaneSession::Renew() {
  v1::OpenSessionRequest req;
  req.set_session_id(id_);
  v1::OpenSessionResponse resp;
  grpc::ClientContext ctx;
  client_->PrepareContext(&ctx);
  return FromGrpcStatus(client_->stub().OpenSession(&ctx, req, &resp));
}

absl::Status DataPlaneSession::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  v1::CloseSessionRequest req;
  req.set_session_id(id_);
  v1::CloseSessionResponse resp;
  grpc::ClientContext ctx;
  client_->PrepareContext(&ctx);
  absl::Status s = FromGrpcStatus(client_->stub().CloseSession(&ctx, req, &resp));
  buffers_.clear();
  return s;
}

absl::StatusOr<WorkerBuffer*> DataPlaneSession::CreateBuffer(int64_t bytes) {
  if (closed_) return absl::FailedPreconditionError("session: closed");
  auto b = std::unique_ptr<WorkerBuffer>(new WorkerBuffer());
  b->size_ = bytes;
  v1::RegisterBufferRequest req;
  req.set_session_id(id_);
  req.set_size_bytes(bytes);
  Interprocess& ipc = *interprocess_;
  b->device_ = !ipc.host_accessible();
  ASSIGN_OR_RETURN(b->memory_, ipc.Allocate(bytes));
  b->data_ = b->memory_->data();
  if (ipc.uses_events()) {
    ASSIGN_OR_RETURN(b->worker_event_, ipc.CreateEvent());
    RETURN_IF_ERROR(b->worker_event_->Record(nullptr));
    req.set_cuda_ipc_event(b->worker_event_->handle());
  }
  if (ipc.transport() == Interprocess::Transport::kCudaIpc) {
    req.set_cuda_ipc_handle(b->memory_->handle());
  } else {
    req.set_shm_name(b->memory_->handle());
  }
  v1::RegisterBufferResponse resp;
  grpc::ClientContext ctx;
  client_->PrepareContext(&ctx);
  absl::Status st = FromGrpcStatus(client_->stub().RegisterBuffer(&ctx, req, &resp));
  b->memory_->Unlink();  // shared memory: the server unlinked it too on success
  RETURN_IF_ERROR(st);
  b->id_ = resp.buffer_id();
  if (ipc.uses_events() && !resp.cuda_ipc_event().empty()) {
    ASSIGN_OR_RETURN(b->server_event_, ipc.OpenEvent(resp.cuda_ipc_event(), "server event"));
  }
  buffers_.push_back(std::move(b));
  return buffers_.back().get();
}

absl::Status DataPlaneSession::ReleaseBuffer(WorkerBuffer* buffer) {
  for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
    if (it->get() != buffer) continue;
    v1::ReleaseBufferRequest req;
    req.set_session_id(id_);
    req.set_buffer_id(buffer->id());
    v1::ReleaseBufferResponse resp;
    grpc::ClientContext ctx;
    client_->PrepareContext(&ctx);
    absl::Status s = FromGrpcStatus(client_->stub().ReleaseBuffer(&ctx, req, &resp));
    buffers_.erase(it);
    return s;
  }
  return absl::NotFoundError("buffer: not a buffer of this session");
}

absl::StatusOr<v1::UpdateRequest> DataPlaneSession::BuildUpdate(absl::string_view model_id,
                                                                const RefUpdateCall& c) {
  ASSIGN_OR_RETURN(ModelGeometry g, client_->Geometry(model_id));
  v1::UpdateRequest req;
  req.set_model_id(std::string(model_id));
  RETURN_IF_ERROR(FillRefUpdate(g, c, &req));
  return req;
}

absl::Status DataPlaneSession::Update(absl::string_view model_id, const RefUpdateCall& call) {
  ASSIGN_OR_RETURN(v1::UpdateRequest req, BuildUpdate(model_id, call));
  v1::UpdateResponse resp;
  grpc::ClientContext ctx;
  client_->PrepareContext(&ctx);
  return FromGrpcStatus(client_->stub().Update(&ctx, req, &resp));
}

// ---------------------------------------------------------------------------
// UpdateSubmitter

absl::StatusOr<std::unique_ptr<UpdateSubmitter>> UpdateSubmitter::Open(DataPlaneSession* session,
                                                                       absl::string_view model_id,
                                                                       BufferTensor done,
                                                                       Options options) {
  if (done.buffer == nullptr) return absl::InvalidArgumentError("done: no buffer");
  if (done.offset < 0 || done.offset % 16 != 0 || done.offset + 8 > done.buffer->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "done.offset: ", done.offset, " (want a multiple of 16 with 8 bytes inside the buffer)"));
  }
  auto s = std::unique_ptr<UpdateSubmitter>(new UpdateSubmitter());
  s->session_ = session;
  s->model_id_ = std::string(model_id);
  s->done_buffer_ = done.buffer;
  s->done_offset_ = done.offset;
  s->interprocess_ = &session->interprocess();
  ASSIGN_OR_RETURN(s->geometry_, session->client().Geometry(model_id));
  // seq restarts at 1 on every stream: the word starts at 0 (a waiter for
  // seq 1 must not pass on an earlier stream's value).
  uint8_t* word = done.buffer->data() + done.offset;
  if (s->interprocess_->host_accessible()) {
    __atomic_store_n(reinterpret_cast<uint64_t*>(word), uint64_t{0}, __ATOMIC_RELEASE);
  } else {
    const uint64_t zero = 0;
    RETURN_IF_ERROR(done.buffer->memory_->Write(done.offset, &zero, 8));
  }
  v1::SubmitUpdatesRequest msg;
  v1::SubmitUpdatesOpen* open = msg.mutable_open();
  open->set_session_id(session->id());
  open->set_model_id(s->model_id_);
  open->mutable_done_ref()->set_buffer_id(done.buffer->id());
  open->mutable_done_ref()->set_offset(done.offset);
  if (s->interprocess_->uses_events()) {
    if (options.ring_size < 1 || options.ring_size > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("ring_size: ", options.ring_size, " is outside 1..1024"));
    }
    for (int i = 0; i < options.ring_size; ++i) {
      ASSIGN_OR_RETURN(std::unique_ptr<InterprocessEvent> e, s->interprocess_->CreateEvent());
      *open->add_cuda_ipc_events() = e->handle();
      s->ring_.push_back(std::move(e));
    }
  }
  s->ctx_ = std::make_unique<grpc::ClientContext>();
  session->client().PrepareContext(s->ctx_.get());
  s->ctx_->set_deadline(std::chrono::system_clock::time_point::max());  // long-lived
  s->stream_ = session->client().stub().SubmitUpdates(s->ctx_.get());
  v1::SubmitUpdatesResponse ack;
  if (!s->stream_->Write(msg) || !s->stream_->Read(&ack)) {
    absl::Status st = FromGrpcStatus(s->stream_->Finish());
    s->stream_.reset();
    s->finished_ = true;
    return st.ok() ? absl::UnavailableError("SubmitUpdates: the server closed the stream") : st;
  }
  s->reader_ = std::make_unique<std::thread>([p = s.get()] { p->ReadReplies(); });
  return s;
}

UpdateSubmitter::~UpdateSubmitter() { Finish().IgnoreError(); }

void UpdateSubmitter::ReadReplies() {
  v1::SubmitUpdatesResponse r;
  while (stream_->Read(&r)) {
    absl::MutexLock lock(&mu_);
    replied_ = r.seq();
    if (r.has_error()) {
      errors_[r.seq()] = absl::Status(static_cast<absl::StatusCode>(r.error().code()),
                                      r.error().message());
      untaken_.push_back(r.seq());
    }
    ++times_.replies;
    times_.wait_us += r.wait_micros();
    times_.kernel_us += r.kernel_micros();
    times_.server_us += r.server_micros();
  }
  absl::Status st = FromGrpcStatus(stream_->Finish());
  absl::MutexLock lock(&mu_);
  stream_status_ = st.ok() ? absl::UnavailableError("SubmitUpdates: the stream ended") : st;
  reader_done_ = true;
}

absl::StatusOr<uint64_t> UpdateSubmitter::Submit(const RefUpdateCall& call, void* stream) {
  if (finished_) return absl::FailedPreconditionError("stream: finished");
  const uint64_t seq = next_seq_;
  v1::SubmitUpdatesRequest msg;
  v1::UpdateSubmission* sub = msg.mutable_update();
  sub->set_seq(seq);
  RETURN_IF_ERROR(FillRefUpdate(geometry_, call, sub->mutable_update()));
  if (!ring_.empty()) {
    const uint64_t n = ring_.size();
    const int entry = static_cast<int>((seq - 1) % n);
    if (seq > n) {
      // The entry's previous generation must have been waited on by the
      // server (its reply is here) before it is re-recorded.
      const uint64_t need = seq - n;
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return replied_ >= need || reader_done_;
      };
      mu_.Await(absl::Condition(&ready));
      if (replied_ < need) return stream_status_;
    }
    RETURN_IF_ERROR(ring_[entry]->Record(stream));
    sub->mutable_wait()->set_index(entry);
  }
  if (!stream_->Write(msg)) {
    absl::MutexLock lock(&mu_);
    return reader_done_ ? stream_status_
                        : absl::UnavailableError("SubmitUpdates: the stream is closed");
  }
  ++next_seq_;
  return seq;
}

absl::Status UpdateSubmitter::StreamWait(uint64_t seq, void* stream) {
  if (seq == 0 || seq >= next_seq_) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq: ", seq, " was not submitted (last: ", next_seq_ - 1, ")"));
  }
  const uint8_t* word = done_buffer_->data() + done_offset_;
  if (!interprocess_->host_accessible()) {
    return interprocess_->StreamWaitWord(stream, word, static_cast<uint32_t>(seq));
  }
  const auto* w = reinterpret_cast<const uint64_t*>(word);
  // Spin for up to 200 us (short updates finish within that), then block
  // until the reply arrives (the server stores the word before it replies),
  // looking at the word every 100 us: a worker on few cores must not starve
  // the CPU backend's threads by polling through a long update.
  const int64_t spin_until = MonotonicNanos() + 200000;
  for (int spins = 1;; ++spins) {
    if (__atomic_load_n(w, __ATOMIC_ACQUIRE) >= seq) return absl::OkStatus();
    if (spins % 64 == 0 && MonotonicNanos() > spin_until) break;
  }
  absl::MutexLock lock(&mu_);
  auto replied = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return replied_ >= seq || reader_done_;
  };
  while (__atomic_load_n(w, __ATOMIC_ACQUIRE) < seq) {
    if (mu_.AwaitWithTimeout(absl::Condition(&replied), absl::Microseconds(100))) {
      if (__atomic_load_n(w, __ATOMIC_ACQUIRE) >= seq) break;
      if (reader_done_) return stream_status_;
    }
  }
  return absl::OkStatus();
}

absl::Status UpdateSubmitter::Wait(uint64_t seq) {
  if (seq == 0 || seq >= next_seq_) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq: ", seq, " was not submitted (last: ", next_seq_ - 1, ")"));
  }
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return replied_ >= seq || reader_done_; };
  mu_.Await(absl::Condition(&ready));
  auto it = errors_.find(seq);
  if (it != errors_.end()) {
    untaken_.erase(std::remove(untaken_.begin(), untaken_.end(), seq), untaken_.end());
    return it->second;
  }
  if (replied_ < seq) return stream_status_;
  return absl::OkStatus();
}

absl::Status UpdateSubmitter::TakeError() {
  absl::MutexLock lock(&mu_);
  if (!untaken_.empty()) {
    const uint64_t seq = untaken_.front();
    untaken_.erase(untaken_.begin());
    return errors_[seq];
  }
  if (reader_done_ && replied_ < next_seq_ - 1) return stream_status_;
  return absl::OkStatus();
}

absl::Status UpdateSubmitter::Finish() {
  if (!finished_) {
    finished_ = true;
    if (stream_ != nullptr) stream_->WritesDone();
    if (reader_ != nullptr) reader_->join();
    const uint64_t last = next_seq_ - 1;
    bool unanswered;
    {
      absl::MutexLock lock(&mu_);
      unanswered = replied_ < last;
    }
    if (unanswered) {
      // Release this worker's streams waiting on the done word.
      RETURN_IF_ERROR(
          interprocess_->ReleaseWord(done_buffer_->data() + done_offset_, last));
    }
  }
  absl::MutexLock lock(&mu_);
  if (!untaken_.empty()) {
    const uint64_t seq = untaken_.front();
    untaken_.erase(untaken_.begin());
    return errors_[seq];
  }
  if (replied_ < next_seq_ - 1) return stream_status_;
  return absl::OkStatus();
}

absl::Status UpdateSubmitter::Cancel() {
  if (ctx_ != nullptr && !finished_) ctx_->TryCancel();
  return Finish();
}

UpdateSubmitter::ServerTimes UpdateSubmitter::server_times() const {
  absl::MutexLock lock(&mu_);
  ServerTimes t = times_;
  if (t.replies > 0) {
    t.wait_us /= t.replies;
    t.kernel_us /= t.replies;
    t.server_us /= t.replies;
  }
  return t;
}

// ---------------------------------------------------------------------------
// AttachedSession

absl::StatusOr<std::unique_ptr<AttachedSession>> AttachedSession::Attach(
    DataPlaneSession* session, absl::string_view model_id, absl::Span<const SlotHandle> slots) {
  auto a = std::unique_ptr<AttachedSession>(new AttachedSession());
  a->session_ = session;
  a->model_id_ = std::string(model_id);
  a->handles_.assign(slots.begin(), slots.end());
  // The local backend first: a failure here leaves nothing attached.
  ASSIGN_OR_RETURN(a->backend_, CreateBackend(session->backend()));
  v1::AttachSlotsRequest req;
  req.set_session_id(session->id());
  req.set_model_id(a->model_id_);
  for (const SlotHandle& h : slots) {
    v1::SlotHandle* p = req.add_slots();
    p->set_id(h.id);
    p->set_generation(h.generation);
  }
  v1::AttachSlotsResponse resp;
  {
    grpc::ClientContext ctx;
    session->client().PrepareContext(&ctx);
    RETURN_IF_ERROR(FromGrpcStatus(session->client().stub().AttachSlots(&ctx, req, &resp)));
  }
  const int64_t now = MonotonicNanos();
  a->expires_at_ns_.store(now + resp.lease_ms() * 1000000);
  a->renew_at_ns_ = now + resp.lease_ms() * 500000;
  for (int i = 0; i < resp.slot_indices_size(); ++i) {
    a->index_[slots[i].id] = {slots[i].generation, resp.slot_indices(i)};
  }
  // From here on a failure detaches in the destructor.
  const v1::CompatibilityTags& tags = resp.tags();
  ModelGeometry g;
  g.arch = tags.geometry().arch() == v1::ARCH_KDA ? Arch::kKda : Arch::kGdn;
  g.layers = tags.geometry().layers();
  g.h_qk = tags.geometry().h_qk();
  g.h_v = tags.geometry().h_v();
  g.d_k = tags.geometry().d_k();
  g.d_v = tags.geometry().d_v();
  g.scale = tags.geometry().scale();
  ASSIGN_OR_RETURN(FormatSpec format, ParseFormatSpec(tags.format()));
  absl::StatusOr<StateLayout> layout =
      resp.layout().key_perm().empty() && resp.layout().value_order().empty()
          ? StateLayout::Identity(g, format)
          : StateLayout::Create(
                g, format, {resp.layout().key_perm().begin(), resp.layout().key_perm().end()},
                {resp.layout().value_order().begin(), resp.layout().value_order().end()},
                {resp.layout().value_scale().begin(), resp.layout().value_scale().end()});
  RETURN_IF_ERROR(layout.status());
  if (layout->Fingerprint() != tags.layout_fingerprint() ||
      layout->slot_bytes() != tags.slot_bytes() ||
      layout->head_layout().head_bytes != resp.head_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tags.layout_fingerprint: the worker's layout (", layout->Fingerprint(),
        ") differs from the server's (", tags.layout_fingerprint(), ")"));
  }
  a->layout_ = std::make_unique<StateLayout>(*std::move(layout));
  ASSIGN_OR_RETURN(a->prepared_, a->backend_->Prepare(*a->layout_));
  const int64_t arena_bytes = resp.num_slots() * tags.slot_bytes();
  Interprocess* ipc = a->backend_->interprocess();
  if (ipc == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend: the ", a->backend_->name(), " backend shares no memory with other processes"));
  }
  if (resp.arena_case() == v1::AttachSlotsResponse::kShmName) {
    ASSIGN_OR_RETURN(a->arena_, ipc->Open(resp.shm_name(), arena_bytes, /*unlink_name=*/false,
                                          "shm_name"));
  } else if (resp.arena_case() == v1::AttachSlotsResponse::kCudaIpcHandle) {
    ASSIGN_OR_RETURN(a->arena_, ipc->Open(resp.cuda_ipc_handle(), arena_bytes,
                                          /*unlink_name=*/false, "arena"));
  } else {
    return absl::InternalError("arena: the server sent no arena");
  }
  a->view_.base = a->arena_->data();
  a->view_.num_slots = resp.num_slots();
  a->view_.layers = g.layers;
  a->view_.heads = g.h_v;
  a->view_.head_bytes = resp.head_bytes();
  ASSIGN_OR_RETURN(a->slot_buffer_,
                   a->backend_->Allocate(std::max<int64_t>(4 * slots.size(), 256)));
  ASSIGN_OR_RETURN(a->fence_, a->backend_->Allocate(16));  // zero: open
  a->engine_view_ = a->view_;
  a->engine_view_.fence = reinterpret_cast<const int32_t*>(a->fence_->data());
  return a;
}

AttachedSession::~AttachedSession() {
  Detach().IgnoreError();
  {
    absl::MutexLock lock(&renew_mu_);
    stop_renewal_ = true;
    renew_cv_.SignalAll();
  }
  if (renewal_.joinable()) renewal_.join();
  order_event_.reset();
  prepared_.reset();
  arena_.reset();
}

absl::Status AttachedSession::OrderAfter(void* stream) {
  // Backends without a stream order their calls by the calling thread.
  void* backend_stream = backend_->native_stream();
  if (backend_stream == nullptr) return absl::OkStatus();
  if (order_event_ == nullptr) {
    ASSIGN_OR_RETURN(order_event_, backend_->interprocess()->CreateEvent());
  }
  RETURN_IF_ERROR(order_event_->Record(stream));
  return order_event_->StreamWait(backend_stream);
}

absl::Status AttachedSession::Detach() {
  if (detached_) return absl::OkStatus();
  detached_ = true;
  renew_at_ns_ = 0;
  {
    absl::MutexLock lock(&renew_mu_);
    stop_renewal_ = true;
    renew_cv_.SignalAll();
  }
  if (fence_ != nullptr) RETURN_IF_ERROR(SetFence());
  v1::DetachSlotsRequest req;
  req.set_session_id(session_->id());
  req.set_model_id(model_id_);
  for (const SlotHandle& h : handles_) {
    v1::SlotHandle* p = req.add_slots();
    p->set_id(h.id);
    p->set_generation(h.generation);
  }
  v1::DetachSlotsResponse resp;
  grpc::ClientContext ctx;
  session_->client().PrepareContext(&ctx);
  return FromGrpcStatus(session_->client().stub().DetachSlots(&ctx, req, &resp));
}

absl::Status AttachedSession::CheckLeaseSlow(int64_t now) {
  if (detached_) return absl::FailedPreconditionError("slots: the session is detached");
  if (now >= expires_at_ns_.load()) {
    detached_ = true;
    renew_at_ns_ = 0;
    return absl::FailedPreconditionError("slots: the attach lease expired");
  }
  RETURN_IF_ERROR(Renew());
  renew_at_ns_ = now + absl::ToInt64Nanoseconds(session_->lease()) / 2;
  return absl::OkStatus();
}

absl::Status AttachedSession::StageSlots(absl::Span<const SlotHandle> slots) {
  if (slots.empty() || slots.size() > handles_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("slots: ", slots.size(), " slots; 1..",
                                                   handles_.size(), " are attached"));
  }
  std::vector<int32_t> idx(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    auto it = index_.find(slots[i].id);
    if (it == index_.end() || it->second.first != slots[i].generation) {
      return absl::FailedPreconditionError(
          absl::StrCat("slots[", i, "]: not attached by this session (no attach lease)"));
    }
    idx[i] = it->second.second;
  }
  staged_handles_.clear();  // a failed copy leaves nothing cached
  RETURN_IF_ERROR(backend_->CopyIn(slot_buffer_->data(), idx.data(), 4 * idx.size()));
  staged_handles_.assign(slots.begin(), slots.end());
  return absl::OkStatus();
}

absl::Status AttachedSession::DecodeUpdate(int layer, absl::Span<const SlotHandle> slots,
                                           DecodeInputs in) {
  const int64_t now = MonotonicNanos();
  if (now >= renew_at_ns_) RETURN_IF_ERROR(CheckLeaseSlow(now));
  bool same = slots.size() == staged_handles_.size();
  for (size_t i = 0; same && i < slots.size(); ++i) same = slots[i] == staged_handles_[i];
  if (!same) RETURN_IF_ERROR(StageSlots(slots));
  in.batch = static_cast<int>(slots.size());
  in.slots = reinterpret_cast<const int32_t*>(slot_buffer_->data());
  return backend_->DecodeUpdate(*prepared_, view_, layer, in);
}

absl::Status AttachedSession::SetFence() {
  fenced_.store(true);
  const int32_t one = 1;
  RETURN_IF_ERROR(backend_->CopyIn(fence_->data(), &one, sizeof(one)));
  // Engine work already enqueued (on any stream) may still write the pool:
  // it completes before the slots go back to the server.
  return backend_->interprocess()->SynchronizeDevice();
}

absl::Status AttachedSession::CheckAttached() const {
  if (fenced_.load()) {
    return absl::FailedPreconditionError("slots: the session is detached (the pool is fenced)");
  }
  if (MonotonicNanos() >= expires_at_ns_.load()) {
    return absl::FailedPreconditionError(
        "slots: the attach lease expired (renew it off the hot path: Renew / RenewInBackground)");
  }
  return absl::OkStatus();
}

absl::Status AttachedSession::Renew() {
  if (fenced_.load()) return absl::FailedPreconditionError("slots: the session is detached");
  const int64_t now = MonotonicNanos();
  absl::Status st = session_->Renew();
  if (!st.ok()) {
    if (MonotonicNanos() >= expires_at_ns_.load()) SetFence().IgnoreError();
    return st;
  }
  expires_at_ns_.store(now + absl::ToInt64Nanoseconds(session_->lease()));
  return absl::OkStatus();
}

void AttachedSession::RenewInBackground() {
  absl::MutexLock lock(&renew_mu_);
  if (renewal_.joinable() || stop_renewal_) return;
  renewal_ = std::thread([this] {
    absl::MutexLock l(&renew_mu_);
    while (!stop_renewal_) {
      const absl::Duration half = session_->lease() / 2;
      const bool timed_out = renew_cv_.WaitWithTimeout(&renew_mu_, half);
      if (stop_renewal_ || !timed_out) continue;
      renew_mu_.Unlock();
      Renew().IgnoreError();  // failures fence the pool once the lease has passed
      renew_mu_.Lock();
    }
  });
}

}  // namespace statecache
