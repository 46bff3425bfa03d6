// The multi-turn prefix-reuse workload of issue 6 (statecachectl demo and
// serve-bench): chat-like conversations whose every turn extends the previous
// one, run through the reference model worker on a live statecached.
//
// A conversation is cut from one corpus document into turns; each turn is
//   prompt: `prompt_bytes` new bytes, prefilled in one chunk, then
//   reply:  `reply_bytes` bytes run as decode steps, one byte per step (one
//           UpdateStream request per layer), teacher-forced from the document
//           so that runs in different state formats see the same bytes and
//           can be compared position by position.
// Turn k's full context is turns 0..k (prompts and replies). The remote run
// (RunRemoteWorkload) serves every turn like a prefix-caching server would:
//   1. LookupPrefix over the turn's whole context (every prefix is a
//      candidate) and Restore the longest checkpoint plus its conv windows
//      (RestoreSession), or start from zero on a miss;
//   2. prefill what the checkpoint does not cover: the new prompt, plus the
//      earlier turns again ("recomputed tokens") when the previous turn's
//      checkpoint was evicted;
//   3. decode the reply; 4. Snapshot under the context so far.
// Time to first output (TTFT) of a turn = steps 1-2: from the lookup until
// the logits that predict the first reply byte exist.
//
// The FP32 reference (RunFp32Reference) keeps one in-process FP32 session per
// conversation alive and runs the same chunks: no checkpoints, no format.
//
// Predictions: position p of a conversation (the logits after token p, which
// predict token p + 1) is scored once, in the turn where token p is new;
// recomputed positions are not scored again. So every run scores the same
// positions and CompareRuns can match them.
//
//   ASSIGN_OR_RETURN(auto convs, MakeConversations(docs, options));
//   auto schedule = MakeSchedule(convs, options);
//   ASSIGN_OR_RETURN(WorkloadResult damp, RunRemoteWorkload(model, client, "gdn-damp",
//                                                          convs, schedule, {}));
//   ASSIGN_OR_RETURN(WorkloadResult ref, RunFp32Reference(model, convs, schedule));
//   ASSIGN_OR_RETURN(Accuracy acc, CompareRuns(damp, ref));
#ifndef STATECACHE_CLIENT_REMOTE_STORE_MULTI_TURN_H_
#define STATECACHE_CLIENT_REMOTE_STORE_MULTI_TURN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpp/statecache_client.h"
#include "client/model/corpus.h"
#include "client/model/model.h"
#include "client/remote_store/remote_state_store.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

struct Turn {
  std::vector<int32_t> prompt;  // new bytes, prefilled
  std::vector<int32_t> reply;   // bytes decoded one step at a time (teacher forced)
};

struct Conversation {
  std::string name;  // "prose#1"
  std::vector<Turn> turns;
  // All bytes of the conversation in order.
  std::vector<int32_t> Tokens() const;
};

struct WorkloadOptions {
  int conversations = 4;   // from the first documents, domains interleaved
  int turns = 4;
  int prompt_bytes = 96;
  int reply_bytes = 16;
  // false: conversations take turns round-robin; true: a seeded random
  // interleaving (each conversation's turns stay in order).
  bool shuffle = false;
  uint64_t seed = 1;
};

// Cuts conversation i from document i of a domain-interleaved order (python,
// prose, cpp, python, ...). kInvalidArgument naming the option when a value
// is < 1, there are fewer documents than conversations, or a document is
// shorter than turns * (prompt_bytes + reply_bytes) + 1.
absl::StatusOr<std::vector<Conversation>> MakeConversations(const std::vector<Document>& docs,
                                                            const WorkloadOptions& options);

// (conversation, turn) in serving order.
std::vector<std::pair<int, int>> MakeSchedule(const std::vector<Conversation>& conversations,
                                              const WorkloadOptions& options);

struct TurnStats {
  int conversation = 0;
  int turn = 0;
  // Context tokens before this turn's prompt (0 for the first turn).
  int64_t context_tokens = 0;
  // Tokens restored from a checkpoint (0 = miss).
  int64_t restored_tokens = 0;
  // Tokens prefilled: the new prompt plus the recomputed ones.
  int64_t prefilled_tokens = 0;
  // context_tokens - restored_tokens: earlier tokens prefilled again.
  int64_t recomputed_tokens = 0;
  double ttft_ms = 0;
  double turn_ms = 0;  // TTFT + reply decode + snapshot
};

// Scores of one conversation by position p (prediction of token p + 1).
struct ConversationScores {
  std::vector<float> nll_bits;  // -log2 softmax(logits)[token p + 1]
  std::vector<int16_t> argmax;  // greedy prediction
  std::vector<uint8_t> reply;   // 1 when token p + 1 is a reply byte (decode step)
  std::vector<uint8_t> scored;  // 1 once recorded
};

struct WorkloadResult {
  std::string description;  // the store
  std::vector<TurnStats> turns;  // in schedule order
  std::vector<ConversationScores> scores;
  // UpdateStream round trips (one layer, one token), microseconds.
  std::vector<double> update_micros;
  double wall_seconds = 0;
};

// Decides, turn by turn, how much of a turn's context the remote run
// restores, in place of the run's own LookupPrefix (serve-bench's cache
// subject: checkpoints of another geometry, other instances). Calls come in
// schedule order from the run's thread; `step` indexes the schedule.
class TurnCache {
 public:
  virtual ~TurnCache() = default;
  // Before the turn's restore; `prompt` = the turn's context + its new
  // prompt. Returns how many leading tokens to restore: 0 (start from zero
  // states), or the end of an earlier turn of this conversation (the run
  // snapshots every turn's end, so that checkpoint exists), < prompt.size().
  // Its time counts in the turn's TTFT.
  virtual absl::StatusOr<int64_t> BeforeTurn(int step, int conversation, int turn,
                                             absl::Span<const int32_t> prompt) = 0;
  // After the turn's snapshot, with the context so far (turns 0..turn).
  virtual absl::Status AfterTurn(int step, int conversation, int turn,
                                 absl::Span<const int32_t> context) = 0;
};

// Serves the schedule through statecached with one RemoteStateStore (one
// slot, reused turn after turn) of the registered `model_id`. Without
// `cache` every turn restores the longest checkpointed prefix of its
// context; with it, exactly the prefix cache->BeforeTurn names
// (kInternal when the run's own checkpoint of that length is gone).
absl::StatusOr<WorkloadResult> RunRemoteWorkload(const LanguageModel& model, StateCacheClient* client,
                                                 const std::string& model_id,
                                                 const std::vector<Conversation>& conversations,
                                                 const std::vector<std::pair<int, int>>& schedule,
                                                 RemoteStateStore::Options store_options,
                                                 TurnCache* cache = nullptr);

// The same turns with in-process FP32 states (one live session per
// conversation).
absl::StatusOr<WorkloadResult> RunFp32Reference(const LanguageModel& model,
                                                const std::vector<Conversation>& conversations,
                                                const std::vector<std::pair<int, int>>& schedule);

struct Accuracy {
  int64_t predicted = 0;        // scored positions
  int64_t reply_predicted = 0;  // of which predict a reply (decoded) byte
  double bits_per_byte = 0;
  double reference_bits_per_byte = 0;
  double agreement = 0;        // same argmax as the reference, all positions
  double reply_agreement = 0;  // ... positions predicting reply bytes
};
// kInvalidArgument when the two runs did not score the same positions.
absl::StatusOr<Accuracy> CompareRuns(const WorkloadResult& run, const WorkloadResult& reference);

// Linear-interpolated percentile (p in [0, 100]) of `values`; 0 when empty.
double Percentile(std::vector<double> values, double p);

// The DAMP layout the demo registers: FP32 trajectories of the first
// `per_domain` documents of each domain of `calibration_docs` (each from the
// zero state), the calibration of issue 3 (kernels/calibration, damp
// statistics only) and BuildLayout with the format's default selector (E*P).
// `info` receives a one-line summary.
absl::StatusOr<StateLayout> CalibrateLayout(const LanguageModel& model,
                                            const std::vector<Document>& calibration_docs,
                                            int per_domain, const FormatSpec& format,
                                            std::string* info);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_REMOTE_STORE_MULTI_TURN_H_
