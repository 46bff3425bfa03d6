// Metrics: every Prometheus series statecached exports.
//
// One object owns the prometheus::Registry and builds every metric family
// once, in its constructor, each with a Help string saying what is counted.
// Pool and checkpoint series are pulled at scrape time: Collect() asks the
// `StatsSource` for a snapshot of every model's SlotPoolStats and
// CheckpointStats and maps each field 1:1 onto a series (cumulative fields
// onto counters, current values onto gauges). Those series come from one
// table, kPoolSeries in metrics.cc: a row per family {name, help, type,
// extra label, source field}; adding a pool series is adding a row. RPC,
// batch and kernel series are pushed by the service as calls complete.
//
// Series (labels in braces):
//   statecache_state_bytes{model,format,tier}, statecache_checkpoint_bytes{model,format,tier},
//   statecache_prefix_lookups_total{model,format,result} and the other
//   per-model pool series {model,format}      (kPoolSeries)
//   statecache_rpc_duration_seconds{method}            histogram
//   statecache_rpcs_total{method,code}                 counter
//   statecache_update_batch_size                       histogram
//   statecache_kernel_duration_seconds{op}             histogram
//   statecache_build_info{version,revision,backend}    gauge (always 1)
//   statecache_device_memory_free_bytes{backend}       gauge (CUDA backend only)
//   process_resident_memory_bytes, process_open_fds,
//   process_start_time_seconds                         gauges (from /proc/self)
//   process_cpu_seconds_total                          counter (user + system)
//
// Thread-safe. Register with an Exposer via Start(), or read the text format
// with Scrape() (tests).
//
//   auto metrics = std::make_shared<Metrics>(source);
//   RETURN_IF_ERROR(metrics->Start("127.0.0.1:9464"));
//   metrics->ObserveRpc("Update", 0, 0.0012);
#ifndef STATECACHE_SERVER_METRICS_H_
#define STATECACHE_SERVER_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/pool/checkpoint_store.h"
#include "server/pool/slot_pool.h"

namespace statecache {

// One model's stats at scrape time.
struct ModelStatsSnapshot {
  std::string model_id;
  std::string format;  // canonical spec, e.g. "damp:16"
  // Distinguishes registrations of the same id (a re-registered model starts
  // new series, so its counters restart from zero).
  int64_t registration = 0;
  SlotPoolStats slots;
  CheckpointStats checkpoints;  // all zero when the model has no checkpoint memory
};

// The process series, read from procfs `proc_self` ("/proc/self"); a
// field that cannot be read is -1.
struct ProcessStats {
  int64_t resident_bytes = -1;
  int64_t open_fds = -1;
  double cpu_seconds = -1;         // user + system
  double start_time_seconds = -1;  // since the Unix epoch
};
ProcessStats ReadProcessStats(const std::string& proc_self);

class Metrics : public prometheus::Collectable,
                public std::enable_shared_from_this<Metrics> {
 public:
  using StatsSource = std::function<std::vector<ModelStatsSnapshot>()>;

  // The RPC method names of statecache.v1.StateCache, read from the proto's
  // service descriptor (series are created for each up front so dashboards
  // see zeros before the first call).
  static const std::vector<std::string>& MethodNames();

  struct Options {
    StatsSource stats;
    // Labels of statecache_build_info.
    std::string version = "unknown";
    std::string revision = "unknown";
    std::string backend = "unknown";
    // Free device memory at scrape time (statecache_device_memory_free_bytes);
    // empty = no series (the CPU backend: host memory is process_*).
    std::function<absl::StatusOr<int64_t>()> device_free_bytes;
    // procfs directory of the process (tests point it elsewhere).
    std::string proc_self = "/proc/self";
  };

  explicit Metrics(Options options);
  explicit Metrics(StatsSource source);
  ~Metrics() override;

  // Serves /metrics on `address` ("127.0.0.1:9464"; port 0 picks one).
  // kUnavailable when the port cannot be bound. Call at most once; `this`
  // must be owned by a shared_ptr.
  absl::Status Start(const std::string& address);
  // Port the exposer listens on (0 before Start).
  int port() const;

  // A finished RPC (or one UpdateStream / SubmitUpdates message): its method
  // (one of MethodNames(); other names count in statecache_rpcs_total only),
  // grpc status code and wall time.
  void ObserveRpc(absl::string_view method, int code, double seconds);
  // Slots in one Update / UpdateStream message.
  void ObserveUpdateBatch(int batch);
  // Backend time of one operation: "decode_update", "prefill", "pack_states",
  // "unpack_states", "copy_slots".
  void ObserveKernel(absl::string_view op, double seconds);

  // prometheus::Collectable: refreshes the pool series, then collects.
  std::vector<prometheus::MetricFamily> Collect() const override;
  // The text exposition format of Collect() (for tests and GetStats debugging).
  std::string Scrape() const;

 private:
  struct ModelSeries;
  void Refresh() const ABSL_LOCKS_EXCLUDED(mu_);
  ModelSeries& SeriesFor(const ModelStatsSnapshot& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveSeries(ModelSeries& series) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void RefreshProcess() const;

  const Options options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;

  // Pool and checkpoint families, one per kPoolSeries row (in its order).
  struct PoolFamily {
    prometheus::Family<prometheus::Gauge>* gauge = nullptr;      // gauge rows
    prometheus::Family<prometheus::Counter>* counter = nullptr;  // counter rows
  };
  static std::vector<PoolFamily> BuildPoolFamilies(prometheus::Registry& registry);
  const std::vector<PoolFamily> pool_;
  // Call families.
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Family<prometheus::Histogram>& update_batch_;
  prometheus::Family<prometheus::Histogram>& kernel_duration_;
  // Build, device and process families.
  prometheus::Family<prometheus::Gauge>& build_info_;
  prometheus::Family<prometheus::Gauge>& device_free_;
  prometheus::Family<prometheus::Gauge>& resident_bytes_;
  prometheus::Family<prometheus::Gauge>& open_fds_;
  prometheus::Family<prometheus::Gauge>& start_time_;
  prometheus::Family<prometheus::Counter>& cpu_seconds_;
  prometheus::Gauge* device_free_series_ = nullptr;
  prometheus::Gauge* resident_bytes_series_ = nullptr;
  prometheus::Gauge* open_fds_series_ = nullptr;
  prometheus::Gauge* start_time_series_ = nullptr;
  prometheus::Counter* cpu_seconds_series_ = nullptr;

  prometheus::Histogram* update_batch_series_ = nullptr;
  absl::flat_hash_map<std::string, prometheus::Histogram*> rpc_series_;  // fixed after ctor

  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, std::unique_ptr<ModelSeries>> models_
      ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<std::string, prometheus::Histogram*> kernel_series_
      ABSL_GUARDED_BY(mu_);
  mutable double cpu_seconds_last_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace statecache

#endif  // STATECACHE_SERVER_METRICS_H_
