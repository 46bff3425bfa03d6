// RemoteStateStore: the model worker's RecurrentStateStore on a live
// statecached (issue 4's remote half, issue 6's client side).
//
// One store = one slot of a registered model on the server. Decode steps go
// over one UpdateStream per store (one request per layer per token, pipelined
// up to `Options::pipeline` requests deep when a call carries several tokens),
// prefill chunks are one Prefill RPC per layer, WriteStates is a states
// Prefill, Reset releases the slot and allocates a fresh (zeroed) one. With
// the CPU backend on the server the readouts are bit-identical to a
// BackendStateStore in process with the same layout (tested).
//
// Checkpoints: SnapshotSession / RestoreSession (below) store and restore a
// ModelSession's complete resumable state: the packed recurrent states (in the
// server's checkpoint arena) plus, per layer, the session's short-convolution
// window as the checkpoint's auxiliary bytes.
//
//   ASSIGN_OR_RETURN(auto client, StateCacheClient::Connect(address));
//   ASSIGN_OR_RETURN(auto store, RemoteStateStore::Create(client.get(), "gdn-tiny", {}));
//   ModelSession session(model.get(), store.get());
//   RETURN_IF_ERROR(session.Forward(prompt, RecurrentMode::kPrefill, &logits));
//   ASSIGN_OR_RETURN(PrefixKey key, SnapshotSession(session, *store, prompt));
//   ...  // later, in another store / worker:
//   ASSIGN_OR_RETURN(RestoreOutcome r, RestoreSession(session2, *store2, next_prompt));
//   // r.restored_tokens of next_prompt are in the state; run the rest.
//
// Thread-safety: like every RecurrentStateStore, one store serves one
// sequence and its calls must not run concurrently. Many stores may share
// one client. The client must outlive the store.
#ifndef STATECACHE_CLIENT_REMOTE_STORE_REMOTE_STATE_STORE_H_
#define STATECACHE_CLIENT_REMOTE_STORE_REMOTE_STATE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpp/statecache_client.h"
#include "client/model/model.h"
#include "client/model/recurrent_state_store.h"
#include "kernels/layout/state_layout.h"
#include "server/pool/prefix_key.h"
#include "server/pool/slot_handle.h"

namespace statecache {

class RemoteStateStore : public RecurrentStateStore {
 public:
  struct Options {
    // Decode steps over an UpdateStream (true) or unary Update RPCs.
    bool use_stream = true;
    // Requests in flight on the stream when one Decode call carries several
    // tokens (>= 1). Bounded so that neither side's flow-control window can
    // fill up while the other waits.
    int pipeline = 8;
    // The layout the model was registered with. Needed only by ReadStates
    // (Export + unpack in process); its fingerprint must equal the server's
    // (checked by Create: kFailedPrecondition).
    std::optional<StateLayout> layout;
    // Record the wall time of every Update round trip (update_micros()).
    bool record_latency = true;
  };

  // Fetches the model (kNotFound when it is not registered) and allocates one
  // slot (kResourceExhausted when the pool is full).
  static absl::StatusOr<std::unique_ptr<RemoteStateStore>> Create(StateCacheClient* client,
                                                                  std::string model_id,
                                                                  Options options);
  // Releases the slot (errors are ignored: the server may be gone).
  ~RemoteStateStore() override;

  const ModelGeometry& geometry() const override { return geometry_; }
  // "statecached <target>, model gdn-tiny, damp:16 (calibrated layout)".
  std::string Describe() const override;
  absl::Status Decode(int layer, const RecurrentInputs& in, float* o) override;
  absl::Status Prefill(int layer, const RecurrentInputs& in, float* o) override;
  // Releases the slot and allocates a zeroed one (the handle changes).
  absl::Status Reset() override;
  // Export + unpack with Options::layout (kFailedPrecondition without one).
  absl::StatusOr<std::vector<float>> ReadStates() override;
  absl::Status WriteStates(const std::vector<float>& states) override;

  // Checkpoints the slot under the prefix `tokens` with per-layer `aux`
  // (empty or `layers` entries). Returns the key.
  absl::StatusOr<PrefixKey> Snapshot(absl::Span<const int32_t> tokens,
                                     const std::vector<std::string>& aux);
  // Finds the longest checkpointed prefix of `tokens` and copies it into the
  // slot. nullopt on a miss (the slot is untouched).
  struct Restored {
    PrefixKey key;
    std::vector<std::string> aux;
  };
  absl::StatusOr<std::optional<Restored>> RestoreLongestPrefix(absl::Span<const int32_t> tokens);

  const std::string& model_id() const { return model_id_; }
  SlotHandle slot() const { return slot_; }
  const v1::ModelInfo& model_info() const { return info_; }
  // Wall time of each Update round trip (one layer, one token), microseconds:
  // from before its Send to its response (when a multi-token call pipelines,
  // including the time it queued behind earlier requests).
  const std::vector<double>& update_micros() const { return update_micros_; }
  void ClearLatencies() { update_micros_.clear(); }

 private:
  RemoteStateStore(StateCacheClient* client, std::string model_id, Options options)
      : client_(client), model_id_(std::move(model_id)), options_(std::move(options)) {}
  // UpdateCall of token t of `in`.
  UpdateCall TokenCall(int layer, const RecurrentInputs& in, int t) const;
  absl::Status DecodeStream(int layer, const RecurrentInputs& in, float* o);
  absl::Status DecodeUnary(int layer, const RecurrentInputs& in, float* o);

  StateCacheClient* client_;
  std::string model_id_;
  Options options_;
  ModelGeometry geometry_;
  v1::ModelInfo info_;
  SlotHandle slot_;
  bool has_slot_ = false;
  std::unique_ptr<UpdateStream> stream_;  // opened on first use; dropped on error
  std::vector<double> update_micros_;
};

// Per-layer auxiliary bytes of a session (its short-convolution windows).
std::vector<std::string> SessionAux(const ModelSession& session);

// Snapshots `store`'s slot plus `session`'s conv windows under `tokens`
// (everything the session has consumed since its Reset). The session must
// run on `store`.
absl::StatusOr<PrefixKey> SnapshotSession(const ModelSession& session, RemoteStateStore& store,
                                          absl::Span<const int32_t> tokens);

struct RestoreOutcome {
  bool hit = false;
  // Tokens of the candidate the restored state has consumed (0 on a miss).
  int64_t restored_tokens = 0;
};
// Restores the longest checkpointed prefix of `tokens` into `store` and the
// conv windows into `session`; on a miss the session is Reset() (zero
// states and windows). Afterwards the caller runs tokens[restored_tokens:].
// kDataLoss when a hit checkpoint carries no (or malformed) aux bytes.
absl::StatusOr<RestoreOutcome> RestoreSession(ModelSession& session, RemoteStateStore& store,
                                              absl::Span<const int32_t> tokens);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_REMOTE_STORE_REMOTE_STATE_STORE_H_
