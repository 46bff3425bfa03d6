// ModelRegistry: the registered models of one server and their memory budgets.
//
// A Model bundles what serving one model needs: its StateLayout, the layout
// prepared on the backend, the SlotPool of live slots and (when it has
// checkpoint memory) the CheckpointStore. Models are shared_ptr: a call that
// found a model keeps it alive even if it is dropped meanwhile; its arenas are
// freed when the last user lets go.
//
// Budgets: the server has a state-memory budget (live slots) and a separate
// checkpoint-memory budget. Registering a model reserves slot_bytes * slots of
// the first and slot_bytes * checkpoints of the second; dropping returns them.
//
// Thread-safe.
//
//   ModelRegistry registry(backend.get(), {.state_budget_bytes = 1 << 30, ...});
//   ASSIGN_OR_RETURN(std::shared_ptr<Model> m, registry.Register(spec));
//   ASSIGN_OR_RETURN(std::shared_ptr<Model> same, registry.Find("qwen"));
#ifndef STATECACHE_SERVER_CORE_MODEL_REGISTRY_H_
#define STATECACHE_SERVER_CORE_MODEL_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/backend/backend.h"
#include "kernels/layout/state_layout.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/slot_pool.h"

namespace statecache {

struct Model {
  std::string id;
  StateLayout layout;
  std::unique_ptr<PreparedModel> prepared;
  std::unique_ptr<SlotPool> slots;
  std::unique_ptr<CheckpointStore> checkpoints;  // null when it has no checkpoint memory
  // Format of the checkpoints in the cold tiers (host, disk, remote); equal
  // to layout.format() when they hold the slot's bytes unchanged.
  FormatSpec checkpoint_format;
  int64_t checkpoint_slot_bytes = 0;  // packed bytes of one checkpoint in it
  int64_t state_bytes = 0;       // reserved of the state budget
  int64_t checkpoint_bytes = 0;  // reserved of the checkpoint budget
  absl::Time registered_at;
  // Owning tenant ("" in the unauthenticated single-tenant mode). Models of
  // different tenants live in separate namespaces (the same id may exist once
  // per tenant); a tenant never sees another's models (issue 8).
  std::string tenant;
};

// What RegisterModel asks for (validated by Register).
struct ModelSpec {
  std::string id;
  std::string tenant;  // owner; "" = the single tenant of the no-auth mode
  ModelGeometry geometry;
  FormatSpec format;
  // Calibrated maps; all empty = identity layout.
  std::vector<int32_t> key_perm;
  std::vector<int32_t> value_order;
  std::vector<float> value_scale;
  // 0 = as many as the remaining budget buys (capped by the max_*_bytes).
  int64_t slots = 0;
  int64_t checkpoints = 0;
  int64_t max_state_bytes = 0;       // 0 = no cap
  int64_t max_checkpoint_bytes = 0;  // 0 = no cap
  // Format of the cold-tier checkpoints (ParseFormatSpec syntax); "" = the
  // registry's tiers.checkpoint_format, itself "" = the slot format.
  std::string checkpoint_format;
};

// Lower checkpoint tiers of each model with checkpoint memory
// (server/pool/checkpoint_tier.h) and the format they hold; statecached's
// --host_checkpoint_bytes, --disk_checkpoint_*, --redis_* and
// --checkpoint_format. A host-memory tier of host_checkpoint_bytes (0 =
// none), and a disk tier of disk_checkpoint_bytes under
// <disk_checkpoint_dir>/<tenant>/<model id> (empty dir = none). Both budgets
// are per model; the host tier's memory is the backend's PinnedMemory when it
// has one. The disk tier's files carry CheckpointTierTags, so a model
// registered again with the same tags finds them after a restart; files of
// other tags are deleted.
struct CheckpointTierOptions {
  int64_t host_checkpoint_bytes = 0;
  // The host tier inclusive: every snapshot also copied into it, so that
  // evicting from checkpoint memory copies nothing and a restore from the
  // host tier is one copy in (CheckpointStore::Options::host_write_through).
  // Off by default: the host budget then also holds copies of what checkpoint
  // memory holds, which costs capacity unless it is several times larger.
  bool host_write_through = false;
  std::string disk_checkpoint_dir;
  int64_t disk_checkpoint_bytes = 0;
  // A Redis tier below the disk tier (host:port, empty = none), shared by
  // every server using the same node; keys carry the tags. Or a Redis
  // Cluster: comma-separated seed host:port list (redis_router.h); at most
  // one of the two.
  std::string redis_checkpoint_address;
  std::string redis_cluster_nodes;
  int64_t redis_checkpoint_ttl_s = 3600;
  int redis_checkpoint_timeout_ms = 20;  // RedisTierOptions::timeout_ms
  double redis_checkpoint_min_mib_per_s = 64;  // RedisTierOptions::min_transfer_mib_per_s
  // Write-through of every snapshot to the Redis tier (checkpoint_store.h)
  // and its queue bound in bytes per model (RemoteWriterOptions).
  bool redis_write_through = true;
  int64_t redis_write_queue_bytes = int64_t{512} << 20;
  // Checkpoint format of models that name none (a format spec; "" = each
  // model's slot format).
  std::string checkpoint_format;
};

class ModelRegistry {
 public:
  struct Options {
    int64_t state_budget_bytes = 0;
    int64_t checkpoint_budget_bytes = 0;
    absl::Duration default_lease = absl::Seconds(30);
    absl::Duration max_lease = absl::Minutes(10);
    // Time source of the checkpoint leases (tests inject a fake clock);
    // absl::Now when empty.
    std::function<absl::Time()> clock;
    // Allocator of slot arenas (issue 10: shared memory that attached
    // workers can map); null = backend->Allocate.
    std::function<absl::StatusOr<std::unique_ptr<BackendBuffer>>(int64_t bytes)>
        slot_arena_allocator;
    // Lower checkpoint tiers of each model and their format.
    CheckpointTierOptions tiers;
  };

  // `backend` must outlive the registry and every Model it hands out.
  ModelRegistry(Backend* backend, Options options);

  // Validates the spec (kInvalidArgument naming the field: model_id, format,
  // geometry.*, layout.*, checkpoint_format), checks the id is free
  // (kAlreadyExists) and the budgets (kResourceExhausted naming the budget),
  // allocates the arenas.
  //
  // A checkpoint format other than the slot format is a layout of the same
  // geometry with the model's key permutation (damp-sr also takes its value
  // maps, so it needs a damp-sr slot format); with lower tiers configured the
  // checkpoint store transcodes through it (checkpoint_transcoder.h) and the
  // tiers' tags name it.
  absl::StatusOr<std::shared_ptr<Model>> Register(const ModelSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);

  // kNotFound naming model_id. The tenant-less overloads use tenant "".
  // Another tenant's model is reported exactly like an unknown one.
  absl::StatusOr<std::shared_ptr<Model>> Find(absl::string_view tenant,
                                              absl::string_view id) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::shared_ptr<Model>> Find(absl::string_view id) const ABSL_LOCKS_EXCLUDED(mu_) {
    return Find("", id);
  }

  // Removes a model. Without `force`: kFailedPrecondition while it has
  // allocated slots or active (unexpired, unconsumed) leases.
  absl::Status Drop(absl::string_view tenant, absl::string_view id, bool force)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Drop(absl::string_view id, bool force) ABSL_LOCKS_EXCLUDED(mu_) {
    return Drop("", id, force);
  }

  // All models of all tenants, by (tenant, id).
  std::vector<std::shared_ptr<Model>> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // The models of one tenant, by id.
  std::vector<std::shared_ptr<Model>> List(absl::string_view tenant) const
      ABSL_LOCKS_EXCLUDED(mu_);

  int64_t state_budget_bytes() const { return options_.state_budget_bytes; }
  int64_t checkpoint_budget_bytes() const { return options_.checkpoint_budget_bytes; }
  int64_t state_reserved_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t checkpoint_reserved_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Backend* const backend_;
  const Options options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Model>> models_ ABSL_GUARDED_BY(mu_);
  int64_t state_reserved_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t checkpoint_reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

// The compatibility tags written into a model's disk-tier files (and the
// Redis tier's keys and values): tenant, model id, format, layout
// fingerprint, geometry, slot bytes, the packed format revision
// (kPackedFormatVersion) and the salted-key scheme (kSaltedKeyScheme), so
// checkpoints stored under another scheme's keys are dropped, never kept
// unreachable. `layout` is the layout of the checkpoint format
// (Model::checkpoint_format), so a cold checkpoint of another format never
// matches.
std::string CheckpointTierTags(absl::string_view tenant, absl::string_view id,
                               const StateLayout& layout);
// How stored prefix keys are salted (server/pool/prefix_key.h, SaltKey).
inline constexpr char kSaltedKeyScheme[] = "v2";

// Valid model ids: [A-Za-z0-9._-]{1,128}.
absl::Status ValidateModelId(absl::string_view id);

}  // namespace statecache

#endif  // STATECACHE_SERVER_CORE_MODEL_REGISTRY_H_
