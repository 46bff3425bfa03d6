// StateCacheClient: typed C++ client of statecached (statecache.v1).
//
// Wraps the generated stubs: every call returns absl::Status /
// absl::StatusOr (grpc::Status codes map 1:1 onto absl::StatusCode, the
// server's message naming the bad field is kept). Tensors go in as host spans
// with an explicit dtype; shapes are derived from the model's geometry, which
// the client fetches once per model (DescribeModel) and caches. Outputs come
// back as FP32 vectors.
//
// Thread-safe: one client may be shared by many threads (gRPC channels are);
// an UpdateStream belongs to one thread at a time.
//
//   ASSIGN_OR_RETURN(auto client, StateCacheClient::Connect("127.0.0.1:50051"));
//   ASSIGN_OR_RETURN(std::vector<SlotHandle> slots, client->AllocateSlots("qwen", 2));
//   UpdateCall in{.layer = 0, .slots = slots, .q = HostTensor::Fp32(q), ...};
//   ASSIGN_OR_RETURN(std::vector<float> o, client->Update("qwen", in));
#ifndef STATECACHE_CLIENT_CPP_STATECACHE_CLIENT_H_
#define STATECACHE_CLIENT_CPP_STATECACHE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "kernels/backend/backend.h"
#include "kernels/layout/geometry.h"
#include "proto/statecache/v1/statecache.grpc.pb.h"
#include "server/pool/prefix_key.h"
#include "server/pool/slot_handle.h"

namespace statecache {

// grpc::Status -> absl::Status (same code and message).
absl::Status FromGrpcStatus(const grpc::Status& status);

// Host tensor bytes (little-endian) with their element type; the shape is
// implied by the call and the model's geometry.
struct HostTensor {
  DType dtype = DType::kFp32;
  absl::string_view bytes;

  static HostTensor Fp32(absl::Span<const float> values) {
    return {DType::kFp32, absl::string_view(reinterpret_cast<const char*>(values.data()),
                                            values.size() * sizeof(float))};
  }
  // bf16 or fp16 bit patterns.
  static HostTensor Half(DType dtype, absl::Span<const uint16_t> bits) {
    return {dtype, absl::string_view(reinterpret_cast<const char*>(bits.data()),
                                     bits.size() * sizeof(uint16_t))};
  }
};

// One decode step of one layer for B = slots.size() slots.
struct UpdateCall {
  int layer = 0;
  std::vector<SlotHandle> slots;
  HostTensor q;                  // [B, h_qk, d_k]
  HostTensor k;                  // [B, h_qk, d_k], same dtype as q
  HostTensor v;                  // [B, h_v, d_v], same dtype as q
  absl::Span<const float> g;     // GDN [B, h_v]; KDA [B, h_v, d_k]
  absl::Span<const float> beta;  // [B, h_v]
};

// T tokens of one layer for B slots.
struct PrefillCall {
  int layer = 0;
  int tokens = 0;  // T
  std::vector<SlotHandle> slots;
  HostTensor q;                  // [B, T, h_qk, d_k]
  HostTensor k;                  // [B, T, h_qk, d_k]
  HostTensor v;                  // [B, T, h_v, d_v]
  absl::Span<const float> g;     // GDN [B, T, h_v]; KDA [B, T, h_v, d_k]
  absl::Span<const float> beta;  // [B, T, h_v]
  bool want_output = false;
};

// What RegisterModel sends.
struct ModelRegistration {
  std::string model_id;
  ModelGeometry geometry;
  std::string format = "damp:16";
  // Calibrated maps; empty = identity layout.
  std::vector<int32_t> key_perm;
  std::vector<int32_t> value_order;
  std::vector<float> value_scale;
  // Instead of the maps: the bytes of a layout file (kernels/layout/layout_file.h).
  std::string layout_file;
  int64_t slots = 0;        // 0 = the remaining state budget
  int64_t checkpoints = 0;  // 0 = the remaining checkpoint budget
  // Caps of the "0 = remaining budget" defaults above (0 = no cap).
  int64_t max_state_bytes = 0;
  int64_t max_checkpoint_bytes = 0;
  // Format of the cold-tier checkpoints ("" = the server's default, itself
  // the slot format unless statecached --checkpoint_format says otherwise).
  std::string checkpoint_format;
};

struct PrefixLookup {
  bool hit = false;
  PrefixKey key;
  uint64_t lease_id = 0;
  absl::Time lease_expiry;
  int64_t candidate_tokens = 0;
};

struct RestoredCheckpoint {
  std::vector<std::string> aux;
  int64_t num_tokens = 0;
};

// One item of BatchSnapshot: `tokens` (the server computes a key_kind
// chain) when non-empty, else `key` (any kind, e.g. an engine block hash).
struct SnapshotItem {
  SlotHandle slot;
  std::vector<int32_t> tokens;
  PrefixKeyKind key_kind = PrefixKeyKind::kFnv64;
  PrefixKey key;
  std::vector<std::string> aux;
};

// One item of BatchRestore (as Restore).
struct RestoreItem {
  SlotHandle slot;
  PrefixKey key;
  uint64_t lease_id = 0;
};

// One lookup: every prefix of `tokens` (a key_kind chain) when non-empty,
// else the candidate `keys`. peek: no lease (lease_id 0 in the answer), no
// LRU touch, not counted in the lookup statistics.
struct LookupItem {
  std::vector<int32_t> tokens;
  std::vector<PrefixKey> keys;
  PrefixKeyKind key_kind = PrefixKeyKind::kFnv64;
  absl::Duration lease = absl::ZeroDuration();
  bool peek = false;
};

struct ExportedState {
  v1::CompatibilityTags tags;
  std::string packed;
};

// One trajectory file of a Calibrate call (TRAJECTORY_FORMAT.md bytes) and
// its calibration domain ("" = the file's own).
struct CalibrationTrajectory {
  std::string file;
  std::string domain;
};

class StateCacheClient;

// A bidirectional UpdateStream: requests are answered in order. Send() may
// run ahead of Receive() (pipelining); Update() does one round trip.
class UpdateStream {
 public:
  ~UpdateStream();

  // Sends one update; `sequence` is echoed by its response.
  absl::Status Send(absl::string_view model_id, const UpdateCall& in, uint64_t sequence);
  // The next response: its sequence number and o (or the request's error).
  struct Response {
    uint64_t sequence = 0;
    absl::StatusOr<std::vector<float>> o;
  };
  absl::StatusOr<Response> Receive();
  // Send + Receive.
  absl::StatusOr<std::vector<float>> Update(absl::string_view model_id, const UpdateCall& in);
  // Half-closes and returns the stream's final status.
  absl::Status Finish();

 private:
  friend class StateCacheClient;
  UpdateStream(StateCacheClient* client, std::unique_ptr<grpc::ClientContext> ctx);

  StateCacheClient* client_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::UpdateRequest, v1::UpdateResponse>> stream_;
  uint64_t next_sequence_ = 1;
  bool finished_ = false;
};

class StateCacheClient {
 public:
  struct Options {
    // Matches statecached's --max_message_bytes default (1 GiB).
    int max_message_bytes = 1 << 30;
    // Per-call deadline (streams: none).
    absl::Duration timeout = absl::Seconds(120);
    // Sent as "authorization: Bearer <token>" on every call when non-empty
    // (servers with --tenants_file require it).
    std::string bearer_token;
    // Channel credentials; null = plaintext. See TlsCredentials().
    std::shared_ptr<grpc::ChannelCredentials> credentials;
  };

  // TLS channel credentials from PEM files: `root_ca_file` verifies the
  // server (empty = system roots); `cert_file` + `key_file` (both or neither)
  // are the client's certificate for mutual TLS. kInvalidArgument naming an
  // unreadable file.
  static absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsCredentials(
      const std::string& root_ca_file, const std::string& cert_file = "",
      const std::string& key_file = "");

  // Channel to `target` ("host:port" or "unix:/path"), plaintext unless
  // options.credentials is set. Does not
  // wait for the server; calls fail with kUnavailable until it is up.
  static absl::StatusOr<std::unique_ptr<StateCacheClient>> Connect(const std::string& target,
                                                                   Options options);
  static absl::StatusOr<std::unique_ptr<StateCacheClient>> Connect(const std::string& target) {
    return Connect(target, Options());
  }

  // Waits up to `timeout` for the channel to connect (kUnavailable after).
  absl::Status WaitForReady(absl::Duration timeout);

  // grpc.health.v1 Check of `service` ("" = the whole server): true when
  // SERVING.
  absl::StatusOr<bool> CheckHealth(const std::string& service = "");

  absl::StatusOr<v1::ModelInfo> RegisterModel(const ModelRegistration& registration);
  absl::StatusOr<std::vector<v1::ModelInfo>> ListModels();
  absl::StatusOr<v1::ModelInfo> DescribeModel(absl::string_view model_id);
  absl::Status DropModel(absl::string_view model_id, bool force = false);
  // Streams `trajectories` to the server's calibration (settings in the
  // first message, one trajectory per message) and returns the layout file,
  // fingerprint, per-domain counts, stability and - with settings.model_id -
  // the registered model. Uses the client timeout for the whole call.
  absl::StatusOr<v1::CalibrateResponse> Calibrate(
      const v1::CalibrateSettings& settings,
      absl::Span<const CalibrationTrajectory> trajectories);

  absl::StatusOr<std::vector<SlotHandle>> AllocateSlots(absl::string_view model_id, int count);
  absl::Status ReleaseSlots(absl::string_view model_id, absl::Span<const SlotHandle> slots);

  // o [B, h_v, d_v] FP32.
  absl::StatusOr<std::vector<float>> Update(absl::string_view model_id, const UpdateCall& in);
  absl::StatusOr<std::unique_ptr<UpdateStream>> OpenUpdateStream();
  // o [B, T, h_v, d_v] when in.want_output, else empty.
  absl::StatusOr<std::vector<float>> Prefill(absl::string_view model_id, const PrefillCall& in);
  // FP32 states [B, layers, h_v, d_k, d_v] in natural order.
  absl::Status PrefillStates(absl::string_view model_id, absl::Span<const SlotHandle> slots,
                             absl::Span<const float> states);

  // Checkpoint `slot` under the prefix `tokens` (the server hashes them into
  // a key_kind chain) or an explicit key of any kind (kSha256 / kFnv64 chain,
  // kEngine block hash). Returns the key.
  absl::StatusOr<PrefixKey> Snapshot(absl::string_view model_id, SlotHandle slot,
                                     absl::Span<const int32_t> tokens,
                                     const std::vector<std::string>& aux = {},
                                     PrefixKeyKind key_kind = PrefixKeyKind::kFnv64);
  absl::StatusOr<PrefixKey> SnapshotKey(absl::string_view model_id, SlotHandle slot,
                                        PrefixKey key, const std::vector<std::string>& aux = {});
  // Longest cached prefix of `tokens` (every prefix is a candidate), leased
  // for `lease` (zero = server default).
  absl::StatusOr<PrefixLookup> LookupPrefix(absl::string_view model_id,
                                            absl::Span<const int32_t> tokens,
                                            absl::Duration lease = absl::ZeroDuration(),
                                            PrefixKeyKind key_kind = PrefixKeyKind::kFnv64);
  absl::StatusOr<PrefixLookup> LookupPrefixKeys(absl::string_view model_id,
                                                absl::Span<const PrefixKey> keys,
                                                absl::Duration lease = absl::ZeroDuration());
  absl::StatusOr<RestoredCheckpoint> Restore(absl::string_view model_id, SlotHandle slot,
                                        PrefixKey key, uint64_t lease_id = 0);
  // LookupPrefix with peek set (item.peek is ignored): no lease is taken.
  absl::StatusOr<PrefixLookup> PeekPrefix(absl::string_view model_id, const LookupItem& item);
  // Drops a lease from LookupPrefix (kNotFound when unknown or expired).
  absl::Status ReleaseLease(absl::string_view model_id, uint64_t lease_id);

  // Batches (one RPC each): result[i] answers items[i], its own error
  // ("items[i].<field>: ...") when it failed; the outer status fails only
  // for the call (transport, unknown model, empty / oversized batch).
  absl::StatusOr<std::vector<absl::StatusOr<PrefixKey>>> BatchSnapshot(
      absl::string_view model_id, absl::Span<const SnapshotItem> items);
  absl::StatusOr<std::vector<absl::StatusOr<RestoredCheckpoint>>> BatchRestore(
      absl::string_view model_id, absl::Span<const RestoreItem> items);
  absl::StatusOr<std::vector<absl::StatusOr<PrefixLookup>>> BatchLookupPrefix(
      absl::string_view model_id, absl::Span<const LookupItem> items);

  absl::StatusOr<ExportedState> Export(absl::string_view model_id, SlotHandle slot);
  absl::Status Import(absl::string_view model_id, SlotHandle slot, const ExportedState& state);
  // The slot's states decoded to FP32 [layers][h_v][d_k][d_v] in natural key
  // order: the inverse of PrefillStates (bit-exact for fp32).
  absl::StatusOr<std::vector<float>> Unpack(absl::string_view model_id, SlotHandle slot);
  // The checkpoint `key`'s states, as Unpack returns a slot's, decoded where
  // the checkpoint is stored (not restored into a slot). lease_id: a
  // LookupPrefix lease for it (read the leased entry; not consumed).
  // kNotFound when no tier holds it; kResourceExhausted naming
  // max_unpack_bytes over the server's limit.
  absl::StatusOr<std::vector<float>> UnpackCheckpoint(absl::string_view model_id, PrefixKey key,
                                                      uint64_t lease_id = 0);

  // All models ("" ) or one.
  absl::StatusOr<v1::GetStatsResponse> GetStats(absl::string_view model_id = "");

  // The model's geometry (DescribeModel once, then cached).
  absl::StatusOr<ModelGeometry> Geometry(absl::string_view model_id) ABSL_LOCKS_EXCLUDED(mu_);

  v1::StateCache::Stub& stub() { return *stub_; }
  // Sets the per-call deadline and the bearer token on `ctx` (for calls made
  // through stub() directly, e.g. the data plane in dataplane_client.h).
  void PrepareContext(grpc::ClientContext* ctx) const { SetDeadline(ctx); }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  friend class UpdateStream;
  StateCacheClient(std::shared_ptr<grpc::Channel> channel, Options options);
  void SetDeadline(grpc::ClientContext* ctx) const;
  // The Unpack call and its FP32 answer.
  absl::StatusOr<std::vector<float>> CallUnpack(const v1::UnpackRequest& req);
  // The LookupPrefix RPC of `req` (LookupPrefix, LookupPrefixKeys, PeekPrefix).
  absl::StatusOr<PrefixLookup> CallLookup(const v1::LookupPrefixRequest& req);
  absl::Status BuildUpdate(absl::string_view model_id, const UpdateCall& in,
                           v1::UpdateRequest* req);

  const Options options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::StateCache::Stub> stub_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, ModelGeometry> geometry_ ABSL_GUARDED_BY(mu_);
};

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CPP_STATECACHE_CLIENT_H_
