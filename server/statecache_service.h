// StateCacheService: the statecache.v1.StateCache gRPC service.
//
// The gRPC edge of statecached and the ONLY place where absl::Status becomes
// grpc::Status (codes map 1:1). Each RPC validates its request completely
// (model, layer, shapes, dtypes, byte sizes, NaN/Inf, handles) before it
// touches any slot, so a bad request writes nothing and never affects other
// slots; errors are kInvalidArgument naming the field, kNotFound for unknown
// models / handles / prefix keys, kFailedPrecondition for stale handles and
// incompatible states, kResourceExhausted for full pools.
//
// Slots are held exclusively for the duration of a call (SlotPool::Acquire),
// so concurrent calls on distinct slots run in parallel (the backend takes no
// backend-wide lock) and calls on the same slot are serialized. Update reads
// its tensors from the request's bytes and writes o into the response
// (server/core/host_update.h: in place on a host-memory backend, else through
// reused staging buffers); with ComputeOptions::coalesce_updates concurrent
// Updates of one model and layer share one launch. Thread-safe; handlers run
// on gRPC's sync-server threads.
//
// Each RPC is an adapter: authentication, admission and the RPC metric
// (Run), the caller's model, then the transport-free operation of
// server/ops (state_ops.h, calibrate.h) or of the data plane. The RPC groups
// live in statecache_service_{models,slots,state,checkpoints,dataplane}.cc.
//
//   StateCacheService service(backend, &registry, metrics, {});
//   builder.RegisterService(&service);
#ifndef STATECACHE_SERVER_STATECACHE_SERVICE_H_
#define STATECACHE_SERVER_STATECACHE_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kernels/backend/backend.h"
#include "proto/statecache/v1/statecache.grpc.pb.h"
#include "server/auth/tenants.h"
#include "server/call_gate.h"
#include "server/dataplane/data_plane.h"
#include "server/metrics.h"
#include "server/core/model_registry.h"
#include "server/model_store.h"
#include "server/ops/state_ops.h"
#include "server/pool/staging_cache.h"
#include "server/core/update_coalescer.h"
#include "server/core/update_phases.h"

namespace statecache {

// absl::Status -> grpc::Status (same code, same message).
grpc::Status ToGrpcStatus(const absl::Status& status);

class StateCacheService final : public v1::StateCache::Service {
 public:
  // Per-request work bounds (kInvalidArgument naming the field beyond them;
  // server/ops/state_ops.h).
  using Limits = ops::Limits;

  // How Update calls reach the backend (issue 33).
  struct ComputeOptions {
    // Merge concurrent Updates of one model, layer and dtype into one
    // DecodeUpdate launch (server/core/update_coalescer.h; max_batch, max_delay).
    bool coalesce_updates = false;
    UpdateCoalescer::Options coalescer;
    // Staging buffers kept for reuse across calls (server/pool/staging_cache.h).
    int64_t staging_cache_bytes = int64_t{256} << 20;
    // Debug stat: per-phase times of Updates of inline bytes
    // (server/core/update_phases.h); null = not timed.
    std::shared_ptr<UpdatePhases> update_phases;
  };

  // `backend`, `registry` and `metrics` must outlive the service.
  StateCacheService(Backend* backend, ModelRegistry* registry, std::shared_ptr<Metrics> metrics,
                    Limits limits);
  StateCacheService(Backend* backend, ModelRegistry* registry, std::shared_ptr<Metrics> metrics,
                    Limits limits, ComputeOptions compute);

  grpc::Status RegisterModel(grpc::ServerContext* ctx, const v1::RegisterModelRequest* req,
                             v1::RegisterModelResponse* resp) override;
  grpc::Status Calibrate(grpc::ServerContext* ctx, grpc::ServerReader<v1::CalibrateRequest>* reader,
                         v1::CalibrateResponse* resp) override;
  grpc::Status ListModels(grpc::ServerContext* ctx, const v1::ListModelsRequest* req,
                          v1::ListModelsResponse* resp) override;
  grpc::Status DescribeModel(grpc::ServerContext* ctx, const v1::DescribeModelRequest* req,
                             v1::ModelInfo* resp) override;
  grpc::Status DropModel(grpc::ServerContext* ctx, const v1::DropModelRequest* req,
                         v1::DropModelResponse* resp) override;
  grpc::Status AllocateSlots(grpc::ServerContext* ctx, const v1::AllocateSlotsRequest* req,
                             v1::AllocateSlotsResponse* resp) override;
  grpc::Status ReleaseSlots(grpc::ServerContext* ctx, const v1::ReleaseSlotsRequest* req,
                            v1::ReleaseSlotsResponse* resp) override;
  grpc::Status Update(grpc::ServerContext* ctx, const v1::UpdateRequest* req,
                      v1::UpdateResponse* resp) override;
  grpc::Status UpdateStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::UpdateResponse, v1::UpdateRequest>* stream) override;
  // Data plane (issue 10): per-layer updates on registered buffers, replies
  // asynchronous (DataPlane::SubmitUpdates).
  grpc::Status SubmitUpdates(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::SubmitUpdatesResponse, v1::SubmitUpdatesRequest>* stream)
      override;
  grpc::Status Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* req,
                       v1::PrefillResponse* resp) override;
  grpc::Status Snapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest* req,
                        v1::SnapshotResponse* resp) override;
  grpc::Status Restore(grpc::ServerContext* ctx, const v1::RestoreRequest* req,
                       v1::RestoreResponse* resp) override;
  grpc::Status LookupPrefix(grpc::ServerContext* ctx, const v1::LookupPrefixRequest* req,
                            v1::LookupPrefixResponse* resp) override;
  grpc::Status ReleaseLease(grpc::ServerContext* ctx, const v1::ReleaseLeaseRequest* req,
                            v1::ReleaseLeaseResponse* resp) override;
  grpc::Status BatchSnapshot(grpc::ServerContext* ctx, const v1::BatchSnapshotRequest* req,
                             v1::BatchSnapshotResponse* resp) override;
  grpc::Status BatchRestore(grpc::ServerContext* ctx, const v1::BatchRestoreRequest* req,
                            v1::BatchRestoreResponse* resp) override;
  grpc::Status BatchLookupPrefix(grpc::ServerContext* ctx, const v1::BatchLookupPrefixRequest* req,
                                 v1::BatchLookupPrefixResponse* resp) override;
  grpc::Status Export(grpc::ServerContext* ctx, const v1::ExportRequest* req,
                      v1::ExportResponse* resp) override;
  grpc::Status Unpack(grpc::ServerContext* ctx, const v1::UnpackRequest* req,
                      v1::UnpackResponse* resp) override;
  grpc::Status Import(grpc::ServerContext* ctx, const v1::ImportRequest* req,
                      v1::ImportResponse* resp) override;
  grpc::Status GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest* req,
                        v1::GetStatsResponse* resp) override;
  // Data plane (issue 10; server/dataplane/data_plane.h). FAILED_PRECONDITION
  // unless set_dataplane() was called.
  grpc::Status OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                           v1::OpenSessionResponse* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* req,
                            v1::CloseSessionResponse* resp) override;
  grpc::Status RegisterBuffer(grpc::ServerContext* ctx, const v1::RegisterBufferRequest* req,
                              v1::RegisterBufferResponse* resp) override;
  grpc::Status ReleaseBuffer(grpc::ServerContext* ctx, const v1::ReleaseBufferRequest* req,
                             v1::ReleaseBufferResponse* resp) override;
  grpc::Status AttachSlots(grpc::ServerContext* ctx, const v1::AttachSlotsRequest* req,
                           v1::AttachSlotsResponse* resp) override;
  grpc::Status DetachSlots(grpc::ServerContext* ctx, const v1::DetachSlotsRequest* req,
                           v1::DetachSlotsResponse* resp) override;

  // Authentication (issue 8). With a directory, every call must carry
  // metadata "authorization: Bearer <token>" of one of its tenants
  // (kUnauthenticated otherwise) and sees only that tenant's models; without
  // one (the default) authentication is off and every caller is the single
  // default tenant "" (local development mode). Set before serving; the
  // directory must outlive the service.
  void set_tenants(const TenantDirectory* tenants) { tenants_ = tenants; }
  // Persist registrations (RegisterModel / DropModel) in `store` (--data_dir).
  // Set before serving; must outlive the service.
  void set_model_store(ModelStore* store) { model_store_ = store; }
  // Registered buffers and attached mode (issue 10). Set before serving; must
  // outlive the service. Without it buffer references are rejected.
  void set_dataplane(DataPlane* dataplane);
  DataPlane* dataplane() const { return dataplane_; }
  // The tenant of the unauthenticated mode.
  Tenant& default_tenant() { return default_tenant_; }
  // Admission of calls (StateCacheServer::Shutdown drains through it). Once
  // draining, every RPC and stream message that arrives fails kUnavailable
  // before it runs; a stream waiting for its next message ends kUnavailable
  // when the drain begins before its next message, or is cancelled by
  // CallGate::CancelIdleStreams() (every message it had sent before was
  // answered).
  CallGate& call_gate() { return gate_; }

  // The absl-level handlers (also used by tests without gRPC), on behalf of
  // `caller` (default_tenant() when authentication is off).
  absl::Status DoRegisterModel(Tenant& caller, const v1::RegisterModelRequest& req,
                               v1::RegisterModelResponse* resp);
  // Calibrate over the messages of one stream (the first carries the
  // settings); also checks limits.max_calibration_bytes (the gRPC handler
  // checks it while reading, to stop early).
  absl::Status DoCalibrate(Tenant& caller, const std::vector<v1::CalibrateRequest>& msgs,
                           v1::CalibrateResponse* resp);
  absl::Status DoDescribeModel(Tenant& caller, const v1::DescribeModelRequest& req,
                               v1::ModelInfo* resp);
  absl::Status DoDropModel(Tenant& caller, const v1::DropModelRequest& req);
  absl::Status DoAllocateSlots(Tenant& caller, const v1::AllocateSlotsRequest& req,
                               v1::AllocateSlotsResponse* resp);
  absl::Status DoReleaseSlots(Tenant& caller, const v1::ReleaseSlotsRequest& req);
  absl::Status DoUpdate(Tenant& caller, const v1::UpdateRequest& req, v1::UpdateResponse* resp);
  absl::Status DoPrefill(Tenant& caller, const v1::PrefillRequest& req, v1::PrefillResponse* resp);
  absl::Status DoSnapshot(Tenant& caller, const v1::SnapshotRequest& req,
                          v1::SnapshotResponse* resp);
  absl::Status DoRestore(Tenant& caller, const v1::RestoreRequest& req, v1::RestoreResponse* resp);
  absl::Status DoLookupPrefix(Tenant& caller, const v1::LookupPrefixRequest& req,
                              v1::LookupPrefixResponse* resp);
  absl::Status DoReleaseLease(Tenant& caller, const v1::ReleaseLeaseRequest& req);
  absl::Status DoBatchSnapshot(Tenant& caller, const v1::BatchSnapshotRequest& req,
                               v1::BatchSnapshotResponse* resp);
  absl::Status DoBatchRestore(Tenant& caller, const v1::BatchRestoreRequest& req,
                              v1::BatchRestoreResponse* resp);
  absl::Status DoBatchLookupPrefix(Tenant& caller, const v1::BatchLookupPrefixRequest& req,
                                   v1::BatchLookupPrefixResponse* resp);
  absl::Status DoExport(Tenant& caller, const v1::ExportRequest& req, v1::ExportResponse* resp);
  absl::Status DoUnpack(Tenant& caller, const v1::UnpackRequest& req, v1::UnpackResponse* resp);
  absl::Status DoImport(Tenant& caller, const v1::ImportRequest& req);
  absl::Status DoGetStats(Tenant& caller, const v1::GetStatsRequest& req,
                          v1::GetStatsResponse* resp);

  // Fills a ModelInfo (geometry, format, tags, sizes, stats).
  static void FillModelInfo(const Model& model, v1::ModelInfo* info);

 private:
  // Authenticates the call, applies the rate quota, runs handler(Tenant&),
  // records the RPC metric.
  template <typename F>
  grpc::Status Run(const grpc::ServerContext* ctx, const char* method, F&& handler);
  absl::StatusOr<Tenant*> Authenticate(const grpc::ServerContext* ctx);
  absl::Status CheckRegisterQuota(Tenant& caller, ModelSpec* spec);

  Backend* const backend_;
  ModelRegistry* const registry_;
  const std::shared_ptr<Metrics> metrics_;
  const Limits limits_;
  const absl::Time started_;
  // Staging memory of every compute call; the Update coalescer (null when
  // ComputeOptions::coalesce_updates is off).
  const std::unique_ptr<StagingCache> staging_;
  const std::unique_ptr<UpdateCoalescer> coalescer_;
  const std::shared_ptr<UpdatePhases> update_phases_;  // may be null
  const TenantDirectory* tenants_ = nullptr;
  ModelStore* model_store_ = nullptr;
  DataPlane* dataplane_ = nullptr;
  // What the operations run against (backend, staging, coalescer, limits,
  // kernel metrics, the data plane's attached-slot check).
  ops::Context ops_;
  Tenant default_tenant_;
  CallGate gate_;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_STATECACHE_SERVICE_H_
