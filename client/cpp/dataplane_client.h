// Worker side of the data plane (issue 10): registered buffers and attached
// mode for workers co-located with statecached (same host; same GPU for CUDA).
//
// DataPlaneSession: one data-plane session (server/dataplane/data_plane.h).
// Buffers it creates are registered with the server: CPU backend - a POSIX
// shared-memory object (the server maps it and unlinks the name); CUDA
// backend - a cudaMalloc allocation exported by CUDA IPC plus an
// interprocess event recorded after every Write. UpdateRefs sends an Update
// whose tensors are (buffer, offset) references and whose o the server
// writes into a buffer: no tensor bytes travel through gRPC.
//
// AttachedSession: attached mode. The server leases slots to the session and
// hands out its slot arena; the worker maps it (CPU shared memory / CUDA IPC)
// and runs the same Backend::DecodeUpdate in its own process on the mapped
// pool - bit-identical to the server running it. Only attached slots are
// accepted (kFailedPrecondition naming the slot otherwise); the lease is
// renewed in the background of DecodeUpdate calls at half its length, and an
// expired or detached session refuses every slot. Snapshots, restores,
// allocation and eviction stay server-side: Detach first.
//
//   ASSIGN_OR_RETURN(auto session, DataPlaneSession::Open(client.get()));
//   ASSIGN_OR_RETURN(WorkerBuffer* in, session->CreateBuffer(bytes));
//   RETURN_IF_ERROR(in->Write(0, q.data(), q_bytes));
//   RETURN_IF_ERROR(session->Update("qwen", call));            // registered buffers
//   ASSIGN_OR_RETURN(auto attached, AttachedSession::Attach(session.get(), "qwen", slots));
//   RETURN_IF_ERROR(attached->DecodeUpdate(layer, slots, inputs));  // attached mode
//
// UpdateSubmitter: the streamed fast path of registered buffers
// (SubmitUpdates). Per layer the worker calls Submit (never waits for a
// reply) and StreamWait (CUDA: its stream waits on the device for the
// server's done word; CPU: its host polls the done word), then computes the
// next layer's inputs from o:
//
//   ASSIGN_OR_RETURN(auto sub, UpdateSubmitter::Open(session.get(), "qwen", done_buffer));
//   for (int l = 0; l < layers; ++l) {
//     ... write layer l's q, k, v, g, beta on `stream` ...
//     ASSIGN_OR_RETURN(uint64_t seq, sub->Submit(call_for(l), stream));
//     RETURN_IF_ERROR(sub->StreamWait(seq, stream));
//     ... read o on `stream` ...
//   }
//   RETURN_IF_ERROR(sub->Finish());   // or Wait(seq) / TakeError() per step
//
// Python: client/python/statecache/attached.py (attached mode, ctypes over
// libstatecache_dataplane.so, c_api.h).
#ifndef STATECACHE_CLIENT_CPP_DATAPLANE_CLIENT_H_
#define STATECACHE_CLIENT_CPP_DATAPLANE_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cpp/statecache_client.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/interprocess.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

// A buffer registered with the server (owned by its DataPlaneSession).
class WorkerBuffer {
 public:
  ~WorkerBuffer();
  uint64_t id() const { return id_; }
  int64_t size() const { return size_; }
  // Host memory (CPU) or a device pointer (CUDA).
  uint8_t* data() const { return data_; }
  bool device() const { return device_; }
  // Copies host bytes in (CUDA: then records the worker event the server
  // waits on) / out (CUDA: after waiting for the server's event).
  // kInvalidArgument when the range is outside the buffer.
  absl::Status Write(int64_t offset, const void* host, int64_t bytes);
  absl::Status Read(int64_t offset, void* host, int64_t bytes) const;
  // CUDA: record the worker event after writing data() by other means.
  absl::Status MarkWritten();

 private:
  friend class DataPlaneSession;
  friend class UpdateSubmitter;
  WorkerBuffer() = default;
  uint64_t id_ = 0;
  int64_t size_ = 0;
  uint8_t* data_ = nullptr;
  bool device_ = false;
  // Destroyed events first, then the memory.
  std::unique_ptr<InterprocessBuffer> memory_;
  std::unique_ptr<InterprocessEvent> worker_event_;  // uses_events(): recorded after writes
  std::unique_ptr<InterprocessEvent> server_event_;  // uses_events(): waited for before reads
};

// A tensor inside a registered buffer.
struct BufferTensor {
  const WorkerBuffer* buffer = nullptr;
  int64_t offset = 0;  // multiple of 16
  DType dtype = DType::kFp32;
};

struct RefUpdateCall {
  int layer = 0;
  std::vector<SlotHandle> slots;
  BufferTensor q, k, v, g, beta;  // shapes as UpdateCall; g, beta FP32
  BufferTensor o;                 // FP32 [B, h_v, d_v], written by the server
};

class DataPlaneSession {
 public:
  // Opens a session on `client`'s server (lease zero = server default).
  static absl::StatusOr<std::unique_ptr<DataPlaneSession>> Open(
      StateCacheClient* client, absl::Duration lease = absl::ZeroDuration());
  // Closes the session (best effort) and frees the buffers.
  ~DataPlaneSession();

  uint64_t id() const { return id_; }
  // The server's backend: "cpu" or "cuda".
  const std::string& backend() const { return backend_; }
  absl::Duration lease() const { return lease_; }
  StateCacheClient& client() { return *client_; }
  // The memory kind of the server's backend (kernels/backend/interprocess.h).
  Interprocess& interprocess() { return *interprocess_; }

  absl::Status Renew();
  absl::Status Close();

  // Creates a zeroed buffer of `bytes` in the server backend's memory kind
  // and registers it. The pointer stays valid until the session is closed.
  absl::StatusOr<WorkerBuffer*> CreateBuffer(int64_t bytes);
  absl::Status ReleaseBuffer(WorkerBuffer* buffer);

  // One Update with referenced tensors; o lands in call.o.
  absl::Status Update(absl::string_view model_id, const RefUpdateCall& call);
  // The request UpdateRefs sends (for streams and tests).
  absl::StatusOr<v1::UpdateRequest> BuildUpdate(absl::string_view model_id,
                                                const RefUpdateCall& call);

 private:
  DataPlaneSession(StateCacheClient* client) : client_(client) {}
  StateCacheClient* client_;
  uint64_t id_ = 0;
  std::string backend_;
  std::unique_ptr<Interprocess> interprocess_;
  absl::Duration lease_;
  bool closed_ = false;
  std::vector<std::unique_ptr<WorkerBuffer>> buffers_;
};

// One SubmitUpdates stream of a session for one model. Submissions get seq
// 1, 2, 3, ...; replies are read by a background thread. CUDA: a ring of
// `ring_size` interprocess events; Submit records the next entry on the
// worker's stream (after the inputs were written there) and names it, and
// reuses an entry only after the reply of the submission that last used it
// (it blocks only then). Thread-compatible: one thread submits.
class UpdateSubmitter {
 public:
  struct Options {
    int ring_size = 64;  // CUDA ring events (1..DataPlane::kMaxRingEvents)
  };
  // Opens the stream; the done word is 8 bytes at `done.offset` of a
  // buffer of `session` (the server stores each submission's seq there; it
  // is set to 0 here, so one open stream per done word).
  static absl::StatusOr<std::unique_ptr<UpdateSubmitter>> Open(DataPlaneSession* session,
                                                               absl::string_view model_id,
                                                               BufferTensor done,
                                                               Options options);
  static absl::StatusOr<std::unique_ptr<UpdateSubmitter>> Open(DataPlaneSession* session,
                                                               absl::string_view model_id,
                                                               BufferTensor done) {
    return Open(session, model_id, done, Options());
  }
  // Finish() (best effort); cancels the stream if replies are outstanding
  // for too long.
  ~UpdateSubmitter();

  // Submits one update (call.o must be set); returns its seq. CUDA:
  // `stream` (cudaStream_t as void*, nullptr = legacy default stream) is
  // where the worker wrote the inputs. kUnavailable / the stream's status
  // once the stream broke; errors of a submission come back through
  // Wait / TakeError / Finish, never here.
  absl::StatusOr<uint64_t> Submit(const RefUpdateCall& call, void* stream = nullptr);
  // Orders `stream` after submission `seq` (its o written, or it failed):
  // CUDA - enqueues a device-side wait on the done word, the host returns at
  // once; CPU - the host waits until the done word reaches seq.
  absl::Status StreamWait(uint64_t seq, void* stream = nullptr);
  // Host: waits for the reply of `seq`; returns that submission's status.
  absl::Status Wait(uint64_t seq);
  // The first error reply not yet taken (OK if none), without waiting.
  absl::Status TakeError();
  // Half-closes the stream, waits for every reply, returns the first error
  // not taken (or the stream's status). When the stream ended before every
  // submission was answered (server gone, cancelled), raises the done word
  // to the last seq submitted, so that no stream of this worker stays
  // blocked in a StreamWait (their o were not written: the status says so).
  absl::Status Finish();
  // Cancels the stream (replies outstanding are lost; the server stops
  // after the submission it is running), then Finish().
  absl::Status Cancel();

  uint64_t last_seq() const { return next_seq_ - 1; }
  // Mean server-side microseconds per reply so far (wait, kernel, total).
  struct ServerTimes {
    int64_t replies = 0;
    double wait_us = 0, kernel_us = 0, server_us = 0;
  };
  ServerTimes server_times() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  UpdateSubmitter() = default;
  void ReadReplies();

  DataPlaneSession* session_ = nullptr;
  std::string model_id_;
  ModelGeometry geometry_;
  const WorkerBuffer* done_buffer_ = nullptr;
  int64_t done_offset_ = 0;
  Interprocess* interprocess_ = nullptr;  // the session's
  std::vector<std::unique_ptr<InterprocessEvent>> ring_;  // uses_events(): the ring
  uint64_t next_seq_ = 1;
  bool finished_ = false;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SubmitUpdatesRequest, v1::SubmitUpdatesResponse>>
      stream_;
  std::unique_ptr<std::thread> reader_;
  mutable absl::Mutex mu_;
  uint64_t replied_ ABSL_GUARDED_BY(mu_) = 0;  // replies arrive in seq order
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stream_status_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> errors_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> untaken_ ABSL_GUARDED_BY(mu_);  // seqs of errors not taken
  ServerTimes times_ ABSL_GUARDED_BY(mu_);
};

class AttachedSession {
 public:
  // Attaches `slots` of `model_id` to `session` and maps the model's arena
  // into this process; prepares the model's StateLayout (checked against the
  // server's layout fingerprint) on a local backend of the server's kind.
  static absl::StatusOr<std::unique_ptr<AttachedSession>> Attach(
      DataPlaneSession* session, absl::string_view model_id, absl::Span<const SlotHandle> slots);
  // Detaches (best effort).
  ~AttachedSession();

  // The fused decode step of `layer` for `slots` (all attached by this
  // session, no duplicates) run in this process on the mapped pool. Input
  // and output pointers of `in` are in backend() memory (host memory on the
  // CPU, device pointers on CUDA); in.batch and in.slots are filled here.
  // Per-call host cost: one monotonic clock read against a cached deadline
  // (the lease is renewed by an RPC inside the call once half of it has
  // passed) and, when `slots` equals the previous call's slots (a decode
  // loop), one comparison of the handles; otherwise the handles are mapped
  // to slot indices and staged. Not thread-safe: one worker thread per
  // AttachedSession.
  absl::Status DecodeUpdate(int layer, absl::Span<const SlotHandle> slots, DecodeInputs in);

  // CUDA: makes the backend's stream wait (on the device, no host sync) for
  // the work enqueued on `stream` so far (cudaStream_t as void*, nullptr =
  // the legacy default stream): call it before DecodeUpdate when the inputs
  // were produced on another stream (e.g. PyTorch's current stream). o is
  // complete when DecodeUpdate returns (the CUDA binding synchronizes its
  // stream to read back validation). CPU: nothing.
  absl::Status OrderAfter(void* stream);

  // Ends the attachment; the slots go back to server-side use. Sets the
  // fence word first and (CUDA) waits for this process's device work, so no
  // engine call or graph replay of this session writes the pool afterwards.
  absl::Status Detach();

  // ---- Engine path (issue 25): StreamOps on the mapped pool -------------
  // backend().stream_ops() on engine_pool() take device slot indices
  // (IndexOf) and never call the server or wait for the host; an engine
  // captures them in CUDA graphs. The session's lease is renewed off the hot
  // path: RenewInBackground() (or Renew() from the engine's own loop).
  //
  //   a->RenewInBackground();
  //   ops.EnqueueDecode(a->prepared(), a->engine_pool(), layer, in, record, stream);

  // pool() with this session's fence word (PoolView::fence): set by Detach
  // and on lease expiry, it makes every later StreamOps call write nothing
  // (the record says kFailedPrecondition "pool: fenced").
  const PoolView& engine_pool() const { return engine_view_; }
  // kFailedPrecondition when detached or past the lease (a clock read, no
  // RPC); thread-safe. Engine bindings call it before enqueueing.
  absl::Status CheckAttached() const;
  // Renews the session lease now (an RPC). When it fails and the lease has
  // passed, fences the pool. Thread-safe with the engine calls.
  absl::Status Renew();
  // A thread renewing at half the lease until Detach or destruction
  // (idempotent).
  void RenewInBackground();

  Backend& backend() { return *backend_; }
  const StateLayout& layout() const { return *layout_; }
  const PoolView& pool() const { return view_; }
  const PreparedModel& prepared() const { return *prepared_; }
  // Arena index of an attached slot (-1 if not attached here); with pool()
  // and prepared() for diagnostics (dataplane_bench's attached_raw mode).
  int32_t IndexOf(const SlotHandle& slot) const {
    auto it = index_.find(slot.id);
    return it == index_.end() || it->second.first != slot.generation ? -1 : it->second.second;
  }

 private:
  AttachedSession() = default;
  // The slow path of the lease check: detached, expired or due for renewal.
  absl::Status CheckLeaseSlow(int64_t now_ns);
  // Maps `slots` to indices (kFailedPrecondition naming slots[i] for one not
  // attached here) and stages them in slot_buffer_.
  absl::Status StageSlots(absl::Span<const SlotHandle> slots);

  DataPlaneSession* session_ = nullptr;
  std::string model_id_;
  std::vector<SlotHandle> handles_;
  absl::flat_hash_map<uint64_t, std::pair<uint32_t, int32_t>> index_;  // id -> (generation, index)
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StateLayout> layout_;
  std::unique_ptr<PreparedModel> prepared_;
  std::unique_ptr<InterprocessBuffer> arena_;
  PoolView view_;
  std::unique_ptr<BackendBuffer> slot_buffer_;
  std::vector<SlotHandle> staged_handles_;  // handles whose indices are in slot_buffer_
  // Monotonic deadlines (steady clock, ns). DecodeUpdate compares the clock
  // with renew_at_ns_ only (its thread's); it is zero once detached, so that
  // the slow path runs and refuses the call. expires_at_ns_ is the lease end
  // Renew sets (any thread) and CheckAttached / the slow path read.
  int64_t renew_at_ns_ = 0;
  std::atomic<int64_t> expires_at_ns_{0};
  bool detached_ = false;
  std::unique_ptr<InterprocessEvent> order_event_;  // OrderAfter on a backend with a stream

  // Engine path: the fence word (backend memory, int32), the view carrying
  // it and the renewal thread.
  absl::Status SetFence();
  std::unique_ptr<BackendBuffer> fence_;
  PoolView engine_view_;
  std::atomic<bool> fenced_{false};
  absl::Mutex renew_mu_;
  absl::CondVar renew_cv_;
  bool stop_renewal_ ABSL_GUARDED_BY(renew_mu_) = false;
  std::thread renewal_;
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CPP_DATAPLANE_CLIENT_H_
