#include "client/model/eval.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/common/status_macros.h"

namespace statecache {

namespace {

// Adds the NLL (bits) of predicting tokens[t + 1] from logits row t, for the
// rows [0, rows) of `logits` whose targets exist.
void Score(const std::vector<float>& logits, int vocab, absl::Span<const int32_t> targets,
           DocumentEval* out) {
  const int rows = static_cast<int>(targets.size());
  for (int t = 0; t < rows; ++t) {
    const float* z = &logits[static_cast<size_t>(t) * vocab];
    const float* zmax = std::max_element(z, z + vocab);
    double sum = 0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(double{z[i]} - *zmax);
    const double logp = double{z[targets[t]]} - *zmax - std::log(sum);
    out->nll_bits += -logp / std::log(2.0);
    out->argmax.push_back(static_cast<uint8_t>(zmax - z));
    ++out->predicted;
  }
}

}  // namespace

int64_t EvalResult::Predicted() const {
  int64_t n = 0;
  for (const auto& d : docs) n += d.predicted;
  return n;
}

double EvalResult::BitsPerByte() const {
  double bits = 0;
  for (const auto& d : docs) bits += d.nll_bits;
  const int64_t n = Predicted();
  return n > 0 ? bits / static_cast<double>(n) : 0.0;
}

std::map<std::string, double> EvalResult::BitsPerByteByDomain() const {
  std::map<std::string, std::pair<double, int64_t>> acc;
  for (const auto& d : docs) {
    acc[d.domain].first += d.nll_bits;
    acc[d.domain].second += d.predicted;
  }
  std::map<std::string, double> out;
  for (const auto& kv : acc) {
    out[kv.first] = kv.second.second > 0 ? kv.second.first / kv.second.second : 0.0;
  }
  return out;
}

double EvalResult::GreedyAgreement(const EvalResult& other) const {
  int64_t same = 0, total = 0;
  for (size_t i = 0; i < std::min(docs.size(), other.docs.size()); ++i) {
    const auto& a = docs[i].argmax;
    const auto& b = other.docs[i].argmax;
    for (size_t t = 0; t < std::min(a.size(), b.size()); ++t) {
      same += a[t] == b[t];
      ++total;
    }
  }
  return total > 0 ? static_cast<double>(same) / total : 0.0;
}

absl::StatusOr<EvalResult> Evaluate(const LanguageModel& model, RecurrentStateStore* store,
                                    const std::vector<Document>& docs,
                                    const EvalOptions& options) {
  EvalResult result;
  ModelSession session(&model, store);
  const int vocab = model.config().vocab_size;
  for (size_t di = 0; di < docs.size(); ++di) {
    const Document& doc = docs[di];
    const int n = static_cast<int>(doc.bytes.size());
    if (n < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("document ", di, ": ", n, " bytes (need >= 2 to predict anything)"));
    }
    RETURN_IF_ERROR(session.Reset());
    DocumentEval de;
    de.domain = doc.domain;
    // The last byte is only a target, never an input that is scored.
    absl::Span<const int32_t> inputs(doc.bytes.data(), n - 1);
    absl::Span<const int32_t> targets(doc.bytes.data() + 1, n - 1);
    std::vector<float> logits;
    int done = 0;
    if (options.regime == EvalRegime::kPrefillThenDecode && options.prefill_tokens > 0) {
      const int p = std::min(options.prefill_tokens, n - 1);
      RETURN_IF_ERROR(session.Forward(inputs.subspan(0, p), RecurrentMode::kPrefill, &logits));
      Score(logits, vocab, targets.subspan(0, p), &de);
      done = p;
    }
    if (done < n - 1) {
      RETURN_IF_ERROR(session.Forward(inputs.subspan(done), RecurrentMode::kDecode, &logits));
      Score(logits, vocab, targets.subspan(done), &de);
    }
    result.docs.push_back(std::move(de));
  }
  return result;
}

}  // namespace statecache
