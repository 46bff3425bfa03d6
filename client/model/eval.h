// Held-out evaluation: bits per byte (NLL) and greedy next-byte predictions
// of a model whose states live in a given RecurrentStateStore.
//
// Convention (reproduces the training-time numbers, gdn-tiny 1.4605 and
// kda-tiny 1.8131 on heldout.jsonl): every document starts from the zero
// state (and zero conv windows); the model predicts byte t+1 from bytes
// 0..t, for t = 0 .. n-2 (the first byte is never predicted: there is no BOS
// token); the NLL of each prediction is -log2 softmax(logits_t)[byte_{t+1}]
// (log-sum-exp in double); bits/byte = sum of all NLLs over all documents /
// number of predicted bytes over all documents (each document of n bytes
// contributes n-1).
//
// Regimes (issue 4): kDecode runs every token as a decode step (the store
// requantizes after each token); kPrefillThenDecode prefills the first
// `prefill_tokens` bytes as one chunk (stored once), then decodes the rest.
// With FP32 states both give the same numbers up to float rounding.
//
//   ASSIGN_OR_RETURN(EvalResult r, Evaluate(*model, &store, docs, {}));
//   r.BitsPerByte();
#ifndef STATECACHE_CLIENT_MODEL_EVAL_H_
#define STATECACHE_CLIENT_MODEL_EVAL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/model/corpus.h"
#include "client/model/model.h"
#include "client/model/recurrent_state_store.h"

namespace statecache {

enum class EvalRegime : uint8_t { kDecode, kPrefillThenDecode };

struct EvalOptions {
  EvalRegime regime = EvalRegime::kDecode;
  int prefill_tokens = 256;  // kPrefillThenDecode only
};

struct DocumentEval {
  std::string domain;
  int64_t predicted = 0;       // bytes predicted (n - 1)
  double nll_bits = 0;         // sum over predicted bytes
  std::vector<uint8_t> argmax; // [n - 1]: greedy prediction for byte t+1
};

struct EvalResult {
  std::vector<DocumentEval> docs;

  int64_t Predicted() const;
  // Total NLL bits / total predicted bytes.
  double BitsPerByte() const;
  // The same per domain.
  std::map<std::string, double> BitsPerByteByDomain() const;
  // Fraction of positions where the argmax equals `other`'s (same docs).
  double GreedyAgreement(const EvalResult& other) const;
};

// Evaluates `docs` one after another; before each document the session
// (conv windows) and the store are reset. Documents shorter than 2 bytes are
// kInvalidArgument.
absl::StatusOr<EvalResult> Evaluate(const LanguageModel& model, RecurrentStateStore* store,
                                    const std::vector<Document>& docs,
                                    const EvalOptions& options);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_EVAL_H_
