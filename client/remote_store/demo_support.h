// What `statecachectl demo` and `statecachectl serve-bench` share: loading the
// shipped model and corpora from the shared folder, starting (or connecting
// to) a statecached, registering a layout under a free model id, and the
// printing helpers of their reports.
//
//   ASSIGN_OR_RETURN(DemoData data, LoadDemoData("gdn-tiny", /*threads=*/0));
//   ASSIGN_OR_RETURN(ServerHandle server, StartOrConnect(setup));
//   ASSIGN_OR_RETURN(v1::ModelInfo info,
//                    RegisterLayout(server.client.get(), "gdn-tiny-damp", layout, reg));
#ifndef STATECACHE_CLIENT_REMOTE_STORE_DEMO_SUPPORT_H_
#define STATECACHE_CLIENT_REMOTE_STORE_DEMO_SUPPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/statecache_client.h"
#include "client/model/corpus.h"
#include "client/model/model.h"
#include "client/remote_store/child_server.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

struct DemoData {
  std::string model_name;  // "gdn-tiny"
  std::unique_ptr<LanguageModel> model;
  std::vector<Document> heldout;      // the workload's conversations
  std::vector<Document> calibration;  // DAMP calibration
};

// `model` is a folder with config.json + model.safetensors, or a name under
// <shared>/models (kernels/io/test_data.h finds <shared>); the corpora are
// <shared>/corpus/{heldout,calibration}.jsonl. kNotFound naming the path.
absl::StatusOr<DemoData> LoadDemoData(const std::string& model, int threads);

struct ServerSetup {
  // Address of a running statecached; empty = start a child.
  std::string server;
  // The child: binary ("" = FindStatecached), backend and budgets.
  std::string statecached;
  std::string backend = "cpu";
  int64_t state_memory_bytes = int64_t{64} << 20;
  int64_t checkpoint_memory_bytes = int64_t{256} << 20;
  // More flags of the child ("--host_checkpoint_bytes=...").
  std::vector<std::string> extra_args;
};

struct ServerHandle {
  std::unique_ptr<ChildServer> child;  // null when connected to --server
  std::unique_ptr<StateCacheClient> client;
  // "child statecached (pid 123, cpu backend) on unix:/tmp/..." or
  // "statecached at host:port (cpu backend)".
  std::string description;
};

// Starts the child or connects (waiting up to 10 s for the server).
absl::StatusOr<ServerHandle> StartOrConnect(const ServerSetup& setup);

struct Registration {
  int64_t slots = 2;
  int64_t checkpoints = 0;           // 0 = the remaining budget
  int64_t max_checkpoint_bytes = 0;  // 0 = no cap
  // When set: register by sending these layout-file bytes (the server parses
  // and checks them) instead of `layout`'s maps.
  std::string layout_file;
  // Format of the cold-tier checkpoints ("" = the server's default).
  std::string checkpoint_format;
};
// Registers `layout` (its calibrated maps) as `base_id`, or `base_id`-2, -3,
// ... when that id is taken (a shared server may already hold it). The
// registered id is ModelInfo::model_id().
absl::StatusOr<v1::ModelInfo> RegisterLayout(StateCacheClient* client, const std::string& base_id,
                                             const StateLayout& layout, const Registration& reg);

// "1,234,567".
std::string Thousands(int64_t n);
// "316.0 KiB" (binary units).
std::string Bytes(double bytes);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_REMOTE_STORE_DEMO_SUPPORT_H_
