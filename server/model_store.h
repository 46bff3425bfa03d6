// ModelStore: registered models persisted under --data_dir, so that a
// restarted statecached serves the same models (geometry, format, layout,
// slot and checkpoint counts) again. States are volatile: slots and
// checkpoints are NOT persisted (the API says so).
//
// One file per model, <data_dir>/models/<tenant hex>.<model_id>.model, holding
// the RegisterModelRequest (binary protobuf) with its slots / checkpoints set
// to what the registration resolved. Written to a temporary file, fsynced and
// renamed, so a crash leaves the old file or the new one, never a torn one.
// A RegisterModel is acknowledged only after its file is durable.
//
// Thread-safe (each call touches one file; callers serialize per model).
//
//   ASSIGN_OR_RETURN(auto store, ModelStore::Open("/var/lib/statecache"));
//   RETURN_IF_ERROR(store->Save("team-a", request));
//   ASSIGN_OR_RETURN(std::vector<ModelStore::Entry> all, store->LoadAll());
#ifndef STATECACHE_SERVER_MODEL_STORE_H_
#define STATECACHE_SERVER_MODEL_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/statecache/v1/statecache.pb.h"

namespace statecache {

class ModelStore {
 public:
  struct Entry {
    std::string tenant;
    v1::RegisterModelRequest request;
    std::string path;
  };

  // Creates <dir>/models if needed. kInvalidArgument for an empty dir,
  // kUnavailable when it cannot be created or written.
  static absl::StatusOr<std::unique_ptr<ModelStore>> Open(const std::string& dir);

  // Persists (replaces) the registration of (tenant, request.model_id()).
  absl::Status Save(absl::string_view tenant, const v1::RegisterModelRequest& request);
  // Removes it; OK when absent.
  absl::Status Remove(absl::string_view tenant, absl::string_view model_id);
  // Every persisted registration (sorted by file name). A file that cannot be
  // parsed is kDataLoss naming it.
  absl::StatusOr<std::vector<Entry>> LoadAll() const;

  const std::string& dir() const { return dir_; }

 private:
  explicit ModelStore(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(absl::string_view tenant, absl::string_view model_id) const;
  std::string dir_;  // <data_dir>/models
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_MODEL_STORE_H_
