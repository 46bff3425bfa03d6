// Workload: the deterministic multi-turn serving workload of the load tool
// and the fault tests, driven through the C++ client.
//
// A conversation is a sequence of turns; each turn allocates a slot, brings
// it to the end of the previous turn (LookupPrefix + Restore of the previous
// turn's checkpoint, or, on a miss, recomputing every previous turn's
// operations on the fresh slot), runs `prefill_tokens` tokens per layer
// (Prefill) and `decode_steps` decode steps (Update per layer, unary or over
// one UpdateStream), snapshots the slot under the conversation's token ids so
// far and releases it. Every input is a pure function of (seed, conversation,
// turn, operation, layer), and the backend is deterministic, so the digest of
// a conversation's outputs (FNV-1a over the bits of every o of its turns, not
// of recomputation) is the same however many clients run concurrently: a
// serial replay must reproduce it bit for bit.
//
//   WorkloadSpec spec;  // tiny GDN, 3 turns ...
//   ASSIGN_OR_RETURN(auto client, StateCacheClient::Connect(target));
//   RETURN_IF_ERROR(RegisterWorkloadModel(*client, spec));
//   ConversationResult r = RunConversation(*client, spec, /*conversation=*/7, &stats);
#ifndef STATECACHE_TESTS_LOAD_WORKLOAD_H_
#define STATECACHE_TESTS_LOAD_WORKLOAD_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/cpp/statecache_client.h"
#include "kernels/layout/geometry.h"

namespace statecache {

struct WorkloadSpec {
  std::string model_id = "load-gdn";
  ModelGeometry geometry{Arch::kGdn, /*layers=*/2, /*h_qk=*/1, /*h_v=*/2, /*d_k=*/32, /*d_v=*/32};
  std::string format = "damp:8";
  int64_t slots = 64;        // RegisterModel slots
  int64_t checkpoints = 64;  // RegisterModel checkpoints
  int turns = 3;
  int prefill_tokens = 8;  // per turn
  int decode_steps = 4;    // per turn
  bool use_stream = true;  // decode over one UpdateStream per conversation
  uint64_t seed = 1;
};

// Per-client measurements (merge with Add).
struct WorkloadStats {
  int64_t requests = 0;
  std::map<std::string, int64_t> errors_by_code;  // absl::StatusCodeToString -> count
  std::vector<double> latencies_us;               // every RPC / stream round trip
  int64_t restores = 0;                           // turns resumed from a checkpoint
  int64_t recomputes = 0;                         // turns that recomputed the history (lookup miss)
  int64_t acknowledged_updates = 0;

  void Add(const WorkloadStats& other);
  void Error(const absl::Status& s) { ++errors_by_code[absl::StatusCodeToString(s.code())]; }
  // p in [0, 100] of latencies_us (0 when empty).
  double PercentileUs(double p) const;
};

struct ConversationResult {
  absl::Status status;  // first error (the conversation stops there)
  uint64_t digest = 0;  // of every output of completed turns
  int turns_done = 0;
};

// Registers spec.model_id (OK when it already exists with the same format).
absl::Status RegisterWorkloadModel(StateCacheClient& client, const WorkloadSpec& spec);

// Runs one conversation (its number makes its inputs and token ids unique).
ConversationResult RunConversation(StateCacheClient& client, const WorkloadSpec& spec,
                                   int64_t conversation, WorkloadStats* stats);

// Inputs of one operation of a conversation: T tokens (1 for decode) of one
// layer, exactly as RunConversation sends them (FP32, q/k L2-normalized).
struct OpInputs {
  std::vector<float> q, k, v, g, beta;
};
OpInputs MakeOpInputs(const WorkloadSpec& spec, int64_t conversation, int turn, int op, int layer,
                      int tokens);
// The Update of decode inputs `in` (tokens = 1) of `layer` for `slot`. The
// call's g and beta view `in`, which must outlive it.
UpdateCall DecodeCallOf(const OpInputs& in, int layer, SlotHandle slot);

// FNV-1a 64 over the bit patterns of `values`, continuing from `h`.
uint64_t DigestFloats(uint64_t h, const std::vector<float>& values);

}  // namespace statecache

#endif  // STATECACHE_TESTS_LOAD_WORKLOAD_H_
