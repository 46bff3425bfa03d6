#include "server/metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <exception>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "prometheus/text_serializer.h"
#include "proto/statecache/v1/statecache.pb.h"

namespace statecache {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

constexpr const char* kTiers[] = {"hi_rows", "lo_codes", "metadata", "padding"};
constexpr const char* kResults[] = {"hit", "miss"};
// Indexed by StoreTier (server/pool/checkpoint_tier.h).
constexpr const char* kStoreTiers[] = {"device", "host", "disk", "remote"};
static_assert(sizeof(kStoreTiers) / sizeof(kStoreTiers[0]) == kNumStoreTiers, "one per tier");

int64_t Tier(const TierBytes& t, int i) {
  switch (i) {
    case 0: return t.hi_rows;
    case 1: return t.lo_codes;
    case 2: return t.metadata;
    default: return t.padding;
  }
}

enum class SeriesType { kGauge, kCounter };
// The label a family adds to {model, format}, one series per value.
// kStoreTier: store_tier="device"|"host"|"disk"|"remote" (where checkpoints live; a
// tier that is not configured reports zeros).
enum class SplitLabel { kNone, kTier, kResult, kStoreTier };

// One per-model family of pool or checkpoint series. Gauges are set to the
// source field; counters advance by its growth since the last scrape (the
// fields of a counter row are cumulative).
struct PoolSeriesRow {
  const char* name;
  const char* help;
  SeriesType type;
  SplitLabel split;
  // The source field of the series `part` (the tier / result index).
  int64_t (*field)(const ModelStatsSnapshot& s, int part);
  // The series value is field * scale (microseconds -> seconds).
  double scale = 1.0;
};

int Parts(SplitLabel split) {
  switch (split) {
    case SplitLabel::kTier: return 4;
    case SplitLabel::kResult: return 2;
    case SplitLabel::kStoreTier: return kNumStoreTiers;
    default: return 1;
  }
}

#define SC_FIELD(expr) [](const ModelStatsSnapshot& s, int part) -> int64_t { \
  (void)part;                                                                 \
  return expr;                                                                \
}

// Every pool and checkpoint series, in registration (= exposition) order.
const PoolSeriesRow kPoolSeries[] = {
    {"statecache_state_bytes",
     "Bytes of allocated (live) slots by storage tier: hi_rows = high-precision "
     "(fp16) rows of mixed formats, lo_codes = low-precision codes (all rows of "
     "uniform formats), metadata = group scales/zero points, padding = alignment",
     SeriesType::kGauge, SplitLabel::kTier, SC_FIELD(Tier(s.slots.used_bytes, part))},
    {"statecache_state_capacity_bytes", "Bytes of the model's preallocated slot arena",
     SeriesType::kGauge, SplitLabel::kNone, SC_FIELD(s.slots.capacity_bytes)},
    {"statecache_state_fp32_equivalent_bytes",
     "Bytes the allocated slots would need as FP32 states", SeriesType::kGauge,
     SplitLabel::kNone, SC_FIELD(s.slots.fp32_equivalent_bytes)},
    {"statecache_slots_used", "Slots allocated to requests", SeriesType::kGauge,
     SplitLabel::kNone, SC_FIELD(s.slots.allocated)},
    {"statecache_slots_capacity", "Slots in the model's arena", SeriesType::kGauge,
     SplitLabel::kNone, SC_FIELD(s.slots.capacity)},
    {"statecache_checkpoints",
     "Prefix-cache checkpoints held (indexed, or replaced but still leased)", SeriesType::kGauge,
     SplitLabel::kNone, SC_FIELD(s.checkpoints.checkpoints)},
    {"statecache_checkpoint_capacity", "Checkpoints the model's checkpoint arena can hold",
     SeriesType::kGauge, SplitLabel::kNone, SC_FIELD(s.checkpoints.capacity)},
    {"statecache_checkpoint_bytes",
     "Packed bytes of held checkpoints by storage tier (as "
     "statecache_state_bytes)",
     SeriesType::kGauge, SplitLabel::kTier, SC_FIELD(Tier(s.checkpoints.used_bytes, part))},
    {"statecache_checkpoint_capacity_bytes", "Bytes of the model's checkpoint arena",
     SeriesType::kGauge, SplitLabel::kNone, SC_FIELD(s.checkpoints.capacity_bytes)},
    {"statecache_checkpoint_aux_bytes",
     "Worker auxiliary bytes (e.g. conv windows) held by checkpoints, "
     "host memory",
     SeriesType::kGauge, SplitLabel::kNone, SC_FIELD(s.checkpoints.aux_bytes)},
    {"statecache_checkpoints_leased", "Checkpoints pinned by at least one LookupPrefix lease",
     SeriesType::kGauge, SplitLabel::kNone, SC_FIELD(s.checkpoints.leased)},
    {"statecache_leases_active", "LookupPrefix leases not yet consumed by Restore or expired",
     SeriesType::kGauge, SplitLabel::kNone, SC_FIELD(s.checkpoints.leases_active)},
    {"statecache_prefix_lookups_total",
     "LookupPrefix requests by result (hit = some candidate prefix was cached)",
     SeriesType::kCounter, SplitLabel::kResult,
     SC_FIELD(part == 0 ? s.checkpoints.lookups_hit : s.checkpoints.lookups_miss)},
    {"statecache_prefix_lookup_tokens_total",
     "LookupPrefix tokens: hit = tokens covered by the cached prefix, miss = "
     "candidate tokens not covered (must be recomputed)",
     SeriesType::kCounter, SplitLabel::kResult,
     SC_FIELD(part == 0 ? s.checkpoints.lookup_tokens_hit : s.checkpoints.lookup_tokens_miss)},
    {"statecache_checkpoint_evictions_total",
     "Checkpoints evicted (least recently used) to make room for a snapshot",
     SeriesType::kCounter, SplitLabel::kNone, SC_FIELD(s.checkpoints.evictions)},
    {"statecache_leases_expired_total", "Leases that expired before a Restore consumed them",
     SeriesType::kCounter, SplitLabel::kNone, SC_FIELD(s.checkpoints.leases_expired)},
    {"statecache_snapshots_total", "Successful Snapshot calls", SeriesType::kCounter,
     SplitLabel::kNone, SC_FIELD(s.checkpoints.snapshots)},
    {"statecache_restores_total", "Successful Restore calls", SeriesType::kCounter,
     SplitLabel::kNone, SC_FIELD(s.checkpoints.restores)},
    {"statecache_snapshot_bytes_total", "Packed state bytes copied into checkpoints",
     SeriesType::kCounter, SplitLabel::kNone, SC_FIELD(s.checkpoints.bytes_snapshotted)},
    {"statecache_restore_bytes_total", "Packed state bytes copied from checkpoints into slots",
     SeriesType::kCounter, SplitLabel::kNone, SC_FIELD(s.checkpoints.bytes_restored)},
    {"statecache_checkpoint_tier_checkpoints",
     "Checkpoints held by storage tier (device checkpoint memory, host memory, disk; remote: "
     "what this server wrote minus what it took)",
     SeriesType::kGauge, SplitLabel::kStoreTier, SC_FIELD(s.checkpoints.tiers[part].entries)},
    {"statecache_checkpoint_tier_bytes",
     "Packed + aux bytes of the checkpoints held by storage tier", SeriesType::kGauge,
     SplitLabel::kStoreTier, SC_FIELD(s.checkpoints.tiers[part].bytes)},
    {"statecache_checkpoint_tier_capacity_bytes",
     "Byte budget of each storage tier (0 when the tier is not configured)",
     SeriesType::kGauge, SplitLabel::kStoreTier,
     SC_FIELD(s.checkpoints.tiers[part].capacity_bytes)},
    {"statecache_checkpoint_tier_hits_total",
     "Prefix lookups served by each storage tier (host and disk hits are promoted to device)",
     SeriesType::kCounter, SplitLabel::kStoreTier, SC_FIELD(s.checkpoints.tiers[part].hits)},
    {"statecache_checkpoint_tier_misses_total",
     "Prefix lookups each configured storage tier did not serve", SeriesType::kCounter,
     SplitLabel::kStoreTier, SC_FIELD(s.checkpoints.tiers[part].misses)},
    {"statecache_checkpoint_tier_demotions_total",
     "Checkpoints moved from each tier to the one below (the last tier: dropped by its LRU)",
     SeriesType::kCounter, SplitLabel::kStoreTier, SC_FIELD(s.checkpoints.tiers[part].demotions)},
    {"statecache_checkpoint_tier_promotions_total",
     "Checkpoints moved from each tier back into device checkpoint memory",
     SeriesType::kCounter, SplitLabel::kStoreTier,
     SC_FIELD(s.checkpoints.tiers[part].promotions)},
    {"statecache_checkpoint_tier_corrupt_total",
     "Checkpoints found corrupt (checksum, size, tags) in each tier and deleted, never restored",
     SeriesType::kCounter, SplitLabel::kStoreTier,
     SC_FIELD(s.checkpoints.tiers[part].dropped_corrupt)},
    {"statecache_checkpoint_transcodes_to_cold_total",
     "Checkpoints encoded into the model's cold checkpoint format on leaving checkpoint memory "
     "(0 when it is the slot format)",
     SeriesType::kCounter, SplitLabel::kNone, SC_FIELD(s.checkpoints.transcodes_to_cold)},
    {"statecache_checkpoint_transcodes_from_cold_total",
     "Cold-tier checkpoints decoded back into the slot format on promotion",
     SeriesType::kCounter, SplitLabel::kNone, SC_FIELD(s.checkpoints.transcodes_from_cold)},
    {"statecache_checkpoint_tier_requests_total",
     "Calls to the remote (Redis) tier: writes, lookups, takes (0 for local tiers)",
     SeriesType::kCounter, SplitLabel::kStoreTier, SC_FIELD(s.checkpoints.tiers[part].requests)},
    {"statecache_checkpoint_tier_request_seconds_total",
     "Summed wall time of the remote tier's calls; divide its rate by requests_total's for "
     "the mean latency",
     SeriesType::kCounter, SplitLabel::kStoreTier,
     SC_FIELD(s.checkpoints.tiers[part].request_micros), 1e-6},
    {"statecache_checkpoint_tier_errors_total",
     "Failed remote tier calls (connect, timeout, error reply); each one is a miss, never a "
     "failed RPC",
     SeriesType::kCounter, SplitLabel::kStoreTier, SC_FIELD(s.checkpoints.tiers[part].errors)},
    {"statecache_checkpoint_tier_write_through_total",
     "Snapshot copies written through to the remote tier in the background (0 without "
     "write-through and for local tiers)",
     SeriesType::kCounter, SplitLabel::kStoreTier,
     SC_FIELD(s.checkpoints.tiers[part].write_through_written)},
    {"statecache_checkpoint_tier_write_through_dropped_total",
     "Snapshot copies not written through: the write queue was full, or left at shutdown",
     SeriesType::kCounter, SplitLabel::kStoreTier,
     SC_FIELD(s.checkpoints.tiers[part].write_through_dropped)},
    {"statecache_checkpoint_tier_write_through_queued_bytes",
     "Bytes of snapshot copies waiting for the remote tier",
     SeriesType::kGauge, SplitLabel::kStoreTier,
     SC_FIELD(s.checkpoints.tiers[part].write_through_queued_bytes)},
};
constexpr int kPoolRows = sizeof(kPoolSeries) / sizeof(kPoolSeries[0]);

#undef SC_FIELD

Family<Gauge>& G(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}
Family<Counter>& C(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}
Family<Histogram>& H(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r);
}

Histogram::BucketBoundaries LatencyBuckets() {
  // 50 us .. ~26 s, x2 per bucket.
  Histogram::BucketBoundaries b;
  for (double x = 50e-6; x < 30.0; x *= 2) b.push_back(x);
  return b;
}

bool ReadSmallFile(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

ProcessStats ReadProcessStats(const std::string& proc_self) {
  ProcessStats out;
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  std::string statm;
  if (ReadSmallFile(proc_self + "/statm", &statm)) {
    std::vector<absl::string_view> f = absl::StrSplit(statm, ' ', absl::SkipEmpty());
    int64_t pages = 0;
    if (f.size() >= 2 && absl::SimpleAtoi(f[1], &pages) && page > 0) {
      out.resident_bytes = pages * page;
    }
  }
  std::string stat;
  if (ReadSmallFile(proc_self + "/stat", &stat) && ticks > 0) {
    // Fields after the parenthesized command name, which may hold spaces:
    // f[0] = state (field 3), utime = field 14, stime = 15, starttime = 22.
    const size_t close = stat.rfind(')');
    if (close != std::string::npos) {
      std::vector<absl::string_view> f =
          absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
      int64_t utime = 0, stime = 0, start = 0;
      if (f.size() > 19 && absl::SimpleAtoi(f[11], &utime) && absl::SimpleAtoi(f[12], &stime)) {
        out.cpu_seconds = static_cast<double>(utime + stime) / ticks;
      }
      std::string proc_stat;
      if (f.size() > 19 && absl::SimpleAtoi(f[19], &start) &&
          ReadSmallFile(proc_self + "/../stat", &proc_stat)) {
        for (absl::string_view line : absl::StrSplit(proc_stat, '\n')) {
          int64_t btime = 0;
          if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtoi(line, &btime)) {
            out.start_time_seconds = static_cast<double>(btime) + static_cast<double>(start) / ticks;
          }
        }
      }
    }
  }
  if (DIR* dir = opendir((proc_self + "/fd").c_str())) {
    int64_t n = 0;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(dir);
    out.open_fds = n - 1;  // the descriptor of this directory listing
  }
  return out;
}

// Series of one model; pointers owned by the families. Indexed by
// kPoolSeries row, then by label value (tier / result; one without).
struct Metrics::ModelSeries {
  std::string format;
  int64_t registration = 0;
  std::vector<std::vector<Gauge*>> gauges;      // gauge rows
  std::vector<std::vector<Counter*>> counters;  // counter rows
  // Counter rows: the cumulative field value already added.
  std::vector<std::vector<int64_t>> last;
};

std::vector<Metrics::PoolFamily> Metrics::BuildPoolFamilies(prometheus::Registry& registry) {
  std::vector<Metrics::PoolFamily> out(kPoolRows);
  for (int r = 0; r < kPoolRows; ++r) {
    const PoolSeriesRow& row = kPoolSeries[r];
    if (row.type == SeriesType::kGauge) {
      out[r].gauge = &G(registry, row.name, row.help);
    } else {
      out[r].counter = &C(registry, row.name, row.help);
    }
  }
  return out;
}

const std::vector<std::string>& Metrics::MethodNames() {
  static const auto* names = [] {
    const google::protobuf::ServiceDescriptor* service =
        v1::RegisterModelRequest::descriptor()->file()->FindServiceByName("StateCache");
    auto* out = new std::vector<std::string>();
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      out->push_back(service->method(i)->name());
    }
    return out;
  }();
  return *names;
}

Metrics::Metrics(StatsSource source) : Metrics(Options{std::move(source)}) {}

Metrics::Metrics(Options options)
    : options_(std::move(options)),
      registry_(std::make_shared<prometheus::Registry>()),
      pool_(BuildPoolFamilies(*registry_)),
      rpc_duration_(H(*registry_, "statecache_rpc_duration_seconds",
                      "Server-side wall time of each RPC (for UpdateStream: of each message)")),
      rpcs_(C(*registry_, "statecache_rpcs_total",
              "Finished RPCs (UpdateStream: messages) by method and gRPC status code name")),
      update_batch_(H(*registry_, "statecache_update_batch_size",
                      "Slots per Update / UpdateStream message")),
      kernel_duration_(H(*registry_, "statecache_kernel_duration_seconds",
                         "Backend time per operation (decode_update, prefill, pack_states, "
                         "unpack_states, copy_slots)")),
      build_info_(G(*registry_, "statecache_build_info",
                    "Always 1; labels: project version, git revision and state backend of "
                    "this statecached")),
      device_free_(G(*registry_, "statecache_device_memory_free_bytes",
                     "Free memory of the GPU the CUDA backend runs on, at scrape time (no "
                     "series on the CPU backend)")),
      resident_bytes_(G(*registry_, "process_resident_memory_bytes",
                        "Resident set size of the statecached process in bytes")),
      open_fds_(G(*registry_, "process_open_fds", "Open file descriptors of the process")),
      start_time_(G(*registry_, "process_start_time_seconds",
                    "Start time of the process since the Unix epoch in seconds")),
      cpu_seconds_(C(*registry_, "process_cpu_seconds_total",
                     "User and system CPU time of the process in seconds")) {
  const Histogram::BucketBoundaries latency = LatencyBuckets();
  for (const std::string& m : MethodNames()) {
    rpc_series_[m] = &rpc_duration_.Add({{"method", m}}, latency);
  }
  Histogram::BucketBoundaries batch;
  for (double x = 1; x <= 4096; x *= 2) batch.push_back(x);
  update_batch_series_ = &update_batch_.Add({}, batch);
  build_info_
      .Add({{"version", options_.version},
            {"revision", options_.revision},
            {"backend", options_.backend}})
      .Set(1);
  if (options_.device_free_bytes) {
    device_free_series_ = &device_free_.Add({{"backend", options_.backend}});
  }
  resident_bytes_series_ = &resident_bytes_.Add({});
  open_fds_series_ = &open_fds_.Add({});
  start_time_series_ = &start_time_.Add({});
  cpu_seconds_series_ = &cpu_seconds_.Add({});
}

Metrics::~Metrics() = default;

absl::Status Metrics::Start(const std::string& address) {
  if (exposer_ != nullptr) return absl::FailedPreconditionError("metrics: already started");
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot serve on ", address, ": ", e.what()));
  }
  exposer_->RegisterCollectable(
      std::weak_ptr<prometheus::Collectable>(std::shared_ptr<Metrics>(shared_from_this())));
  return absl::OkStatus();
}

int Metrics::port() const {
  if (exposer_ == nullptr) return 0;
  std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports[0];
}

void Metrics::ObserveRpc(absl::string_view method, int code, double seconds) {
  auto it = rpc_series_.find(method);
  if (it != rpc_series_.end()) it->second->Observe(seconds);
  static constexpr const char* kCodeNames[] = {
      "OK",        "CANCELLED",          "UNKNOWN",        "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS", "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",       "UNAVAILABLE",    "DATA_LOSS",
      "UNAUTHENTICATED"};
  const std::string code_name =
      code >= 0 && code <= 16 ? kCodeNames[code] : absl::StrCat("CODE_", code);
  rpcs_.Add({{"method", std::string(method)}, {"code", code_name}}).Increment();
}

void Metrics::ObserveUpdateBatch(int batch) { update_batch_series_->Observe(batch); }

void Metrics::ObserveKernel(absl::string_view op, double seconds) {
  Histogram* h;
  {
    absl::MutexLock lock(&mu_);
    auto it = kernel_series_.find(op);
    if (it == kernel_series_.end()) {
      h = &kernel_duration_.Add({{"op", std::string(op)}}, LatencyBuckets());
      kernel_series_[std::string(op)] = h;
    } else {
      h = it->second;
    }
  }
  h->Observe(seconds);
}

Metrics::ModelSeries& Metrics::SeriesFor(const ModelStatsSnapshot& s) const {
  auto it = models_.find(s.model_id);
  if (it != models_.end() && it->second->format == s.format &&
      it->second->registration == s.registration) {
    return *it->second;
  }
  if (it != models_.end()) {
    RemoveSeries(*it->second);
    models_.erase(it);
  }
  auto series = std::make_unique<ModelSeries>();
  series->format = s.format;
  series->registration = s.registration;
  const Labels base = {{"model", s.model_id}, {"format", s.format}};
  series->gauges.resize(kPoolRows);
  series->counters.resize(kPoolRows);
  series->last.resize(kPoolRows);
  for (int r = 0; r < kPoolRows; ++r) {
    const PoolSeriesRow& row = kPoolSeries[r];
    for (int part = 0; part < Parts(row.split); ++part) {
      Labels labels = base;
      if (row.split == SplitLabel::kTier) labels["tier"] = kTiers[part];
      if (row.split == SplitLabel::kResult) labels["result"] = kResults[part];
      if (row.split == SplitLabel::kStoreTier) labels["store_tier"] = kStoreTiers[part];
      if (row.type == SeriesType::kGauge) {
        series->gauges[r].push_back(&pool_[r].gauge->Add(labels));
      } else {
        series->counters[r].push_back(&pool_[r].counter->Add(labels));
        series->last[r].push_back(0);
      }
    }
  }
  ModelSeries& ref = *series;
  models_[s.model_id] = std::move(series);
  return ref;
}

void Metrics::RemoveSeries(ModelSeries& m) const {
  for (int r = 0; r < kPoolRows; ++r) {
    for (Gauge* g : m.gauges[r]) pool_[r].gauge->Remove(g);
    for (Counter* c : m.counters[r]) pool_[r].counter->Remove(c);
  }
}

void Metrics::Refresh() const {
  const std::vector<ModelStatsSnapshot> snapshots =
      options_.stats ? options_.stats() : std::vector<ModelStatsSnapshot>{};
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<std::string, bool> seen;
  for (const ModelStatsSnapshot& s : snapshots) {
    seen[s.model_id] = true;
    ModelSeries& m = SeriesFor(s);
    for (int r = 0; r < kPoolRows; ++r) {
      const PoolSeriesRow& row = kPoolSeries[r];
      for (size_t part = 0; part < m.gauges[r].size(); ++part) {
        m.gauges[r][part]->Set(static_cast<double>(row.field(s, static_cast<int>(part))) *
                               row.scale);
      }
      // Counters advance by the growth of the cumulative stats since the
      // last scrape (the stats never decrease for one registration of a
      // model).
      for (size_t part = 0; part < m.counters[r].size(); ++part) {
        const int64_t now = row.field(s, static_cast<int>(part));
        int64_t& before = m.last[r][part];
        if (now > before) {
          m.counters[r][part]->Increment(static_cast<double>(now - before) * row.scale);
        }
        before = now;
      }
    }
  }
  for (auto it = models_.begin(); it != models_.end();) {
    if (!seen.contains(it->first)) {
      RemoveSeries(*it->second);
      models_.erase(it++);
    } else {
      ++it;
    }
  }
}

void Metrics::RefreshProcess() const {
  if (device_free_series_ != nullptr) {
    absl::StatusOr<int64_t> free_bytes = options_.device_free_bytes();
    if (free_bytes.ok()) device_free_series_->Set(static_cast<double>(*free_bytes));
  }
  const ProcessStats p = ReadProcessStats(options_.proc_self);
  if (p.resident_bytes >= 0) resident_bytes_series_->Set(static_cast<double>(p.resident_bytes));
  if (p.open_fds >= 0) open_fds_series_->Set(static_cast<double>(p.open_fds));
  if (p.start_time_seconds >= 0) start_time_series_->Set(p.start_time_seconds);
  if (p.cpu_seconds >= 0) {
    absl::MutexLock lock(&mu_);
    if (p.cpu_seconds > cpu_seconds_last_) {
      cpu_seconds_series_->Increment(p.cpu_seconds - cpu_seconds_last_);
      cpu_seconds_last_ = p.cpu_seconds;
    }
  }
}

std::vector<prometheus::MetricFamily> Metrics::Collect() const {
  Refresh();
  RefreshProcess();
  return registry_->Collect();
}

std::string Metrics::Scrape() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

}  // namespace statecache
