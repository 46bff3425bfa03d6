// DataPlane: registered buffers and attached mode for co-located workers
// (issue 10). The gRPC API stays the control plane; tensors stay where the
// worker put them.
//
// Sessions. A worker opens a data-plane session (OpenSession); the session
// belongs to the caller's tenant and owns everything below. It ends on
// CloseSession or when its lease runs out: no OpenSession renewal and no call
// naming it or one of its buffers for lease_ms. Ending releases its buffers
// (unmapped once in-flight calls are done) and its attachments.
//
// Registered buffers (RegisterBuffer). CPU backend: a POSIX shared-memory
// object created by the worker (shm_region.h explains the choice), mapped by
// the server, its name unlinked at once. CUDA backend: a CUDA IPC memory
// handle (cudaIpcOpenMemHandle) plus an optional interprocess event the
// server waits on before reading; the server records its own event after
// writing o. Update / Prefill tensors may then be BufferRefs (buffer id,
// offset): dtype and shape are checked as for inline bytes and the byte range
// against the registered size - out of range is kInvalidArgument naming
// "<field>.ref", never a stray read. Another tenant's buffer is kNotFound like
// an unknown one.
//
// SubmitUpdates (the fast path of registered buffers): one stream per worker
// and model; the worker submits per-layer updates with references and never
// waits for a reply on the critical path. Ordering, worker -> server: on CUDA
// the worker records an entry of its ring of interprocess events after
// writing a submission's inputs and names it; the worker re-records an entry
// only after the reply of the submission that last named it. On CUDA each
// stream runs its submissions on a DecodeQueue of its own (backend.h; a
// non-blocking CUDA stream): the server's host enqueues the ring-event wait,
// validation, fused kernel and done word and moves on; the reply follows
// from the queue's completion thread. The ring-event wait is device-side
// behind a RingGate (submit_updates.cc) that the server can always release:
// a worker whose event never completes stalls only its own stream, and
// after Options::ring_wait_timeout its gated updates write nothing and the
// stream ends. Slots stay busy until the GPU work on them completed (the
// next update on the same slots shares the access). Server -> worker: after
// each submission (failed ones too) the server stores its seq into the
// stream's done word (a registered buffer), stream-ordered after the
// submission's kernel: the worker's stream waits for it on the device
// (cuStreamWaitValue32), its host does not. Replies (one per submission,
// error set on failure) arrive asynchronously, in seq order.
//
// Attached mode (AttachSlots). The session takes an attach lease over
// allocated slots: the server holds them busy (SlotPool::SlotAccess) so no
// server-side call, eviction or idle release touches them, and refuses calls
// on them (CheckNotAttached: kFailedPrecondition naming the field). The worker
// maps the model's slot arena (CPU: shared memory, needs
// Options::shared_pools at registration; CUDA: an IPC handle of the arena)
// and runs Backend::DecodeUpdate itself (client/cpp/dataplane_client.h).
// Allocation, snapshots, restores and eviction stay server-side: detach
// first.
//
// Thread-safe.
#ifndef STATECACHE_SERVER_DATAPLANE_DATA_PLANE_H_
#define STATECACHE_SERVER_DATAPLANE_DATA_PLANE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/interprocess.h"
#include "proto/statecache/v1/statecache.pb.h"
#include "server/core/model_registry.h"
#include "server/core/proto_convert.h"
#include "server/ops/context.h"
#include "server/pool/slot_handle.h"

namespace statecache {

class DataPlane {
 public:
  struct Options {
    absl::Duration default_lease = absl::Seconds(30);
    absl::Duration max_lease = absl::Minutes(10);
    int64_t max_buffer_bytes = int64_t{64} << 30;
    int max_buffers_per_session = 256;
    // How often expired sessions are swept (zero = never: tests call
    // ExpireSessions).
    absl::Duration sweep_period = absl::Seconds(1);
    // SubmitUpdates on CUDA: how long a worker's ring event may stay
    // incomplete before the stream's gated updates are aborted and the
    // stream ends (DEADLINE_EXCEEDED naming wait.index).
    absl::Duration ring_wait_timeout = absl::Seconds(10);
    // SubmitUpdates on CUDA: the stream's queue waits for the worker's ring
    // events with a device-side event wait (cudaStreamWaitEvent) instead of
    // behind a host-released RingGate (the default; docs/BENCHMARKS.md "Data
    // plane" says why).
    bool device_event_wait = false;
  };
  // Kernel timing callback: (kernel name, seconds, batch).
  using KernelObserver = std::function<void(const char*, double, int)>;

  // `backend` and `registry` must outlive the data plane.
  DataPlane(Backend* backend, ModelRegistry* registry, Options options);
  ~DataPlane();

  absl::Status OpenSession(const std::string& tenant, const v1::OpenSessionRequest& req,
                           v1::OpenSessionResponse* resp);
  absl::Status CloseSession(const std::string& tenant, const v1::CloseSessionRequest& req);
  absl::Status RegisterBuffer(const std::string& tenant, const v1::RegisterBufferRequest& req,
                              v1::RegisterBufferResponse* resp);
  absl::Status ReleaseBuffer(const std::string& tenant, const v1::ReleaseBufferRequest& req);
  absl::Status AttachSlots(const std::string& tenant, const v1::AttachSlotsRequest& req,
                           v1::AttachSlotsResponse* resp);
  absl::Status DetachSlots(const std::string& tenant, const v1::DetachSlotsRequest& req);

  // Ends the sessions unused since before now - lease. Returns how many.
  int64_t ExpireSessions(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // True when an Update / Prefill names a registered buffer anywhere.
  static bool UsesBuffers(const v1::UpdateRequest& req);
  static bool UsesBuffers(const v1::PrefillRequest& req);
  // Update / Prefill (tokens) whose tensors may be BufferRefs or inline
  // bytes, mixed. Same validation and errors as the inline path.
  absl::Status Update(const std::string& tenant, Model& model, const v1::UpdateRequest& req,
                      const ops::Limits& limits, const KernelObserver& observe,
                      v1::UpdateResponse* resp);
  absl::Status Prefill(const std::string& tenant, Model& model, const v1::PrefillRequest& req,
                       const ops::Limits& limits, const KernelObserver& observe,
                       v1::PrefillResponse* resp);

  // The SubmitUpdates stream. `read` returns false at the end of the stream,
  // `write` false when the client went away (read and write are called from
  // two threads of their own, concurrently, as gRPC's sync streams allow); `admit` runs before each
  // submission (the tenant's rate quota), `done` after it (code, seconds;
  // metrics). Returns the status that ends the stream: OK when the client
  // half-closed or went away, else the open message's error (naming
  // "open.<field>"). Submission errors are replies, never the stream's end.
  struct StreamIo {
    std::function<bool(v1::SubmitUpdatesRequest*)> read;
    std::function<bool(const v1::SubmitUpdatesResponse&)> write;
    std::function<absl::Status()> admit;
    std::function<void(absl::StatusCode, double)> done;
    // True once the call was cancelled: queued submissions are dropped.
    std::function<bool()> cancelled;
  };
  absl::Status SubmitUpdates(const std::string& tenant, const StreamIo& io,
                             const ops::Limits& limits, const KernelObserver& observe);
  // Most ring events one SubmitUpdates stream may register.
  static constexpr int kMaxRingEvents = 1024;

  // kFailedPrecondition naming field[i] when one of `handles` of `model` is
  // attached to a session. Call before SlotPool::Acquire.
  absl::Status CheckNotAttached(const Model& model, absl::Span<const SlotHandle> handles,
                                absl::string_view field) const ABSL_LOCKS_EXCLUDED(mu_);

  int64_t session_count() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t buffer_count() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t attached_count() const ABSL_LOCKS_EXCLUDED(mu_);

  // A mapped buffer (CPU shared memory or CUDA IPC).
  class Buffer {
   public:
    virtual ~Buffer() = default;
    virtual uint8_t* data() const = 0;
    virtual int64_t size() const = 0;
    // CUDA: wait for the worker's event before reading; record the server's
    // event after writing. CPU: nothing (the RPC itself orders the accesses).
    virtual absl::Status BeforeRead() { return absl::OkStatus(); }
    virtual absl::Status AfterWrite() { return absl::OkStatus(); }
    virtual std::string server_event_handle() const { return ""; }
    // Raises the 8-byte word (little-endian) at `offset` (8-aligned, in
    // range) to `value` (a maximum: it never goes back) once everything
    // written before is visible to the worker: CPU a release CAS; CUDA a
    // one-thread atomicMax kernel on `stream` (the stream's DecodeQueue
    // after the submission's kernel, or the backend's stream), no host wait.
    virtual absl::Status StoreWord(int64_t offset, uint64_t value, void* stream) = 0;
  };

 private:
  struct Attachment {
    std::shared_ptr<Model> model;
    std::vector<uint64_t> ids;  // handle ids
    std::vector<SlotHandle> handles;
    std::unique_ptr<SlotPool::SlotAccess> access;
  };
  struct Session {
    uint64_t id = 0;
    std::string tenant;
    absl::Duration lease;
    absl::Time last_used;
    std::vector<uint64_t> buffers;
    std::vector<std::unique_ptr<Attachment>> attachments;
  };
  struct BufferEntry {
    std::shared_ptr<Buffer> buffer;
    std::string tenant;
    uint64_t session = 0;
  };
  // A resolved tensor: a pointer in backend memory.
  struct Resolved {
    DType dtype = DType::kFp32;
    void* data = nullptr;
    int64_t bytes = 0;
    std::shared_ptr<Buffer> buffer;           // for references
    std::unique_ptr<BackendBuffer> staged;    // for inline bytes
  };

  absl::StatusOr<Session*> FindSessionLocked(const std::string& tenant, uint64_t id,
                                             absl::string_view field)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndSessionLocked(uint64_t id, std::vector<std::unique_ptr<Attachment>>* detached,
                        std::vector<std::shared_ptr<Buffer>>* released)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Buffer>> FindBuffer(const std::string& tenant, uint64_t id,
                                                     absl::string_view field)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Resolved> Resolve(const std::string& tenant, const v1::Tensor& t,
                                   absl::string_view field, absl::Span<const DType> allowed,
                                   absl::Span<const int64_t> shape);
  absl::StatusOr<Resolved> ResolveOutput(const std::string& tenant, bool has_ref,
                                         const v1::BufferRef& ref, absl::string_view field,
                                         int64_t count);
  absl::StatusOr<Resolved> ResolveRef(const std::string& tenant, const v1::BufferRef& ref,
                                      absl::string_view field, DType dtype, int64_t count);
  uint64_t NewIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Slot indices staged in backend memory, cached by value: a worker's
  // decode loop reuses the same batch every layer and step, and a device
  // allocation per call would cost more than the rest of the call. Cached
  // buffers are never written after staging, so concurrent calls share them.
  absl::StatusOr<std::shared_ptr<BackendBuffer>> StagedIndices(const std::vector<int32_t>& idx)
      ABSL_LOCKS_EXCLUDED(index_mu_);
  // Update with a replaceable worker -> server ordering: null `before_read`
  // waits for the registered buffers' events and records the server event
  // of o's buffer after writing (unary Update); otherwise before_read runs
  // instead and no buffer event is recorded (SubmitUpdates).
  // An Update resolved and checked, its slots held and indices staged:
  // ready for Backend::DecodeUpdate or a DecodeQueue. Holding it keeps the
  // referenced buffers mapped and the slots busy.
  // The ops::TensorSource of registered buffers (data_plane.cc): resolves
  // references and inline bytes into backend memory, waits for the worker's
  // events, publishes o. Holding it keeps the resolved tensors alive.
  class BufferSource;
  struct UpdatePlan {
    std::shared_ptr<Model> model;  // async path: outlives the slot access below
    std::shared_ptr<BufferSource> source;
    std::shared_ptr<SlotPool::SlotAccess> access;
    DecodeInputs in;
    std::atomic<int64_t> enqueue_micros{0};  // async: host time of the enqueue
  };
  // The slots of a SubmitUpdates stream's last update: while an update on
  // them is in flight (`access` alive), the next update naming the same
  // handles of the same model shares that access instead of waiting for it.
  struct HeldSlots {
    const Model* model = nullptr;
    std::vector<SlotHandle> handles;
    std::weak_ptr<SlotPool::SlotAccess> access;
  };
  // Everything of an Update with references before the backend call:
  // ops::PrepareUpdate over a BufferSource (checks, references,
  // `before_read` (null: the buffers' events), the value contract), then the
  // attach check, the slot access (shared through `held` when not null) and
  // the staged indices. Errors name the request's fields.
  absl::Status PlanUpdate(const std::string& tenant, Model& model, const v1::UpdateRequest& req,
                          const ops::Limits& limits,
                          const std::function<absl::Status()>* before_read, HeldSlots* held,
                          UpdatePlan* plan);
  absl::Status UpdateImpl(const std::string& tenant, Model& model, const v1::UpdateRequest& req,
                          const ops::Limits& limits, const KernelObserver& observe,
                          const std::function<absl::Status()>* before_read,
                          v1::UpdateResponse* resp);
  // SubmitUpdates (submit_updates.cc): a stream's state and its opening
  // (errors end the stream), and one submission: StartSubmission runs its
  // checks, ring wait and update (or enqueues them on the stream's queue),
  // RunSubmission then the done word and the reply.
  struct SubmitStream;
  struct SubmissionRun;
  absl::Status OpenSubmitStream(const std::string& tenant, const v1::SubmitUpdatesOpen& open,
                                SubmitStream* s);
  absl::Status StartSubmission(const std::string& tenant, SubmitStream& s,
                               const v1::SubmitUpdatesRequest& msg, const ops::Limits& limits,
                               const KernelObserver& observe, SubmissionRun* run);
  void RunSubmission(const std::string& tenant, SubmitStream& s,
                     const v1::SubmitUpdatesRequest& msg, const ops::Limits& limits,
                     const KernelObserver& observe);
  // The operations layer's context for a call on registered buffers.
  ops::Context OpsContext(const ops::Limits& limits, const KernelObserver& observe) const;
  // The edge's value contract (CheckMagnitudes: L2-normalized q / k
  // rows, |v| <= limits.max_abs_value) on referenced tensors the host can
  // read (CPU backend); the CUDA binding checks finiteness and gates on the
  // device.
  absl::Status HostValueCheck(const ops::Limits& limits, absl::string_view prefix,
                              const Resolved& q, const Resolved& k, const Resolved& v,
                              int d_k) const;

  Backend* const backend_;
  ModelRegistry* const registry_;
  const Options options_;
  // The backend's Interprocess capability (registered buffers, attached
  // arenas, ring events); nullptr: the backend shares no memory.
  Interprocess* const ipc_;
  // Referenced and staged tensors are host memory (the host value check).
  const bool host_readable_;

  mutable absl::Mutex mu_;
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, BufferEntry> buffers_ ABSL_GUARDED_BY(mu_);
  // (model, handle id) -> session, for CheckNotAttached.
  absl::flat_hash_map<std::pair<const Model*, uint64_t>, uint64_t> attached_ ABSL_GUARDED_BY(mu_);

  absl::Mutex index_mu_;
  absl::flat_hash_map<std::vector<int32_t>, std::shared_ptr<BackendBuffer>> index_cache_
      ABSL_GUARDED_BY(index_mu_);

  std::unique_ptr<std::thread> sweeper_;
  absl::Mutex sweeper_mu_;
  bool stop_ ABSL_GUARDED_BY(sweeper_mu_) = false;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_DATAPLANE_DATA_PLANE_H_
