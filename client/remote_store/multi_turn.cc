#include "client/remote_store/multi_turn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/model/fp32_state_store.h"
#include "client/model/record.h"
#include "kernels/calibration/build_layout.h"
#include "kernels/calibration/calibrator.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Turn k's [start, prompt_end, end) positions in the conversation.
struct TurnSpan {
  int64_t start = 0, prompt_end = 0, end = 0;
};
TurnSpan SpanOf(const Conversation& c, int turn) {
  TurnSpan s;
  for (int k = 0; k < turn; ++k) {
    s.start += c.turns[k].prompt.size() + c.turns[k].reply.size();
  }
  s.prompt_end = s.start + c.turns[turn].prompt.size();
  s.end = s.prompt_end + c.turns[turn].reply.size();
  return s;
}

ConversationScores EmptyScores(const Conversation& c) {
  const size_t n = c.Tokens().size();
  ConversationScores s;
  s.nll_bits.assign(n, 0.f);
  s.argmax.assign(n, -1);
  s.reply.assign(n, 0);
  s.scored.assign(n, 0);
  return s;
}

// Records the logits rows of positions [first, first + rows) that are new in
// this turn (>= new_from) and predict an existing token.
void Score(const std::vector<float>& logits, int vocab, int64_t first, int64_t new_from,
           const std::vector<int32_t>& tokens, const std::vector<uint8_t>& is_reply,
           ConversationScores* out) {
  const int64_t rows = static_cast<int64_t>(logits.size()) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = first + r;
    if (p < new_from || p + 1 >= static_cast<int64_t>(tokens.size())) continue;
    const float* row = logits.data() + r * vocab;
    const float mx = *std::max_element(row, row + vocab);
    double sum = 0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    const double logp = static_cast<double>(row[tokens[p + 1]]) - mx - std::log(sum);
    out->nll_bits[p] = static_cast<float>(-logp / std::log(2.0));
    out->argmax[p] = static_cast<int16_t>(std::max_element(row, row + vocab) - row);
    out->reply[p] = is_reply[p + 1];
    out->scored[p] = 1;
  }
}

std::vector<uint8_t> ReplyMask(const Conversation& c) {
  std::vector<uint8_t> m;
  for (const Turn& t : c.turns) {
    m.insert(m.end(), t.prompt.size(), 0);
    m.insert(m.end(), t.reply.size(), 1);
  }
  return m;
}

// Runs tokens[from, span.prompt_end) as one prefill chunk and the reply as
// decode steps, scoring new positions.
absl::Status RunTurn(ModelSession& session, const Conversation& c, const TurnSpan& span,
                     int64_t from, const std::vector<int32_t>& tokens,
                     const std::vector<uint8_t>& reply_mask, int vocab, ConversationScores* scores,
                     Clock::time_point turn_start, TurnStats* stats) {
  std::vector<float> logits;
  const std::vector<int32_t> chunk(tokens.begin() + from, tokens.begin() + span.prompt_end);
  RETURN_IF_ERROR(session.Forward(chunk, RecurrentMode::kPrefill, &logits));
  stats->ttft_ms = MillisSince(turn_start);
  Score(logits, vocab, from, span.start, tokens, reply_mask, scores);
  for (int64_t p = span.prompt_end; p < span.end; ++p) {
    RETURN_IF_ERROR(session.Forward({tokens[p]}, RecurrentMode::kDecode, &logits));
    Score(logits, vocab, p, span.start, tokens, reply_mask, scores);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int32_t> Conversation::Tokens() const {
  std::vector<int32_t> out;
  for (const Turn& t : turns) {
    out.insert(out.end(), t.prompt.begin(), t.prompt.end());
    out.insert(out.end(), t.reply.begin(), t.reply.end());
  }
  return out;
}

absl::StatusOr<std::vector<Conversation>> MakeConversations(const std::vector<Document>& docs,
                                                            const WorkloadOptions& o) {
  if (o.conversations < 1) return absl::InvalidArgumentError("conversations: must be >= 1");
  if (o.turns < 1) return absl::InvalidArgumentError("turns: must be >= 1");
  if (o.prompt_bytes < 1) return absl::InvalidArgumentError("prompt_bytes: must be >= 1");
  if (o.reply_bytes < 1) return absl::InvalidArgumentError("reply_bytes: must be >= 1");
  // Domain-interleaved order, documents of a domain in file order.
  std::vector<std::string> domains;
  std::map<std::string, std::vector<const Document*>> by_domain;
  for (const Document& d : docs) {
    if (by_domain[d.domain].empty()) domains.push_back(d.domain);
    by_domain[d.domain].push_back(&d);
  }
  std::vector<std::pair<std::string, const Document*>> order;
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (const std::string& dom : domains) {
      if (i < by_domain[dom].size()) {
        order.emplace_back(absl::StrCat(dom, "#", i), by_domain[dom][i]);
        any = true;
      }
    }
    if (!any) break;
  }
  if (static_cast<int>(order.size()) < o.conversations) {
    return absl::InvalidArgumentError(absl::StrCat("conversations: ", o.conversations,
                                                   " requested, the corpus has ", order.size(),
                                                   " documents"));
  }
  const int64_t need = int64_t{o.turns} * (o.prompt_bytes + o.reply_bytes) + 1;
  std::vector<Conversation> out;
  for (int i = 0; i < o.conversations; ++i) {
    const Document& d = *order[i].second;
    if (static_cast<int64_t>(d.bytes.size()) < need) {
      return absl::InvalidArgumentError(absl::StrCat(
          "turns: ", o.turns, " turns of ", o.prompt_bytes, "+", o.reply_bytes,
          " bytes need documents of ", need, " bytes; ", order[i].first, " has ", d.bytes.size()));
    }
    Conversation c;
    c.name = order[i].first;
    int64_t pos = 0;
    for (int t = 0; t < o.turns; ++t) {
      Turn turn;
      turn.prompt.assign(d.bytes.begin() + pos, d.bytes.begin() + pos + o.prompt_bytes);
      pos += o.prompt_bytes;
      turn.reply.assign(d.bytes.begin() + pos, d.bytes.begin() + pos + o.reply_bytes);
      pos += o.reply_bytes;
      c.turns.push_back(std::move(turn));
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::pair<int, int>> MakeSchedule(const std::vector<Conversation>& conversations,
                                              const WorkloadOptions& options) {
  std::vector<std::pair<int, int>> out;
  const int n = static_cast<int>(conversations.size());
  if (!options.shuffle) {
    int max_turns = 0;
    for (const Conversation& c : conversations) {
      max_turns = std::max(max_turns, static_cast<int>(c.turns.size()));
    }
    for (int t = 0; t < max_turns; ++t) {
      for (int i = 0; i < n; ++i) {
        if (t < static_cast<int>(conversations[i].turns.size())) out.emplace_back(i, t);
      }
    }
    return out;
  }
  // Random interleaving: a shuffled multiset of conversation ids; the k-th
  // occurrence of id i is its turn k.
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.insert(ids.end(), conversations[i].turns.size(), i);
  std::mt19937_64 rng(options.seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int> next(n, 0);
  for (int i : ids) out.emplace_back(i, next[i]++);
  return out;
}

namespace {

// A turn's restore: the longest checkpointed prefix of `prompt`, or with a
// `cache` exactly the prefix it names (0: the session is Reset).
absl::StatusOr<RestoreOutcome> RestoreTurn(TurnCache* cache, size_t step, int ci, int turn,
                                           const std::vector<int32_t>& prompt,
                                           ModelSession& session, RemoteStateStore& store,
                                           const std::string& name) {
  if (cache == nullptr) return RestoreSession(session, store, prompt);
  ASSIGN_OR_RETURN(const int64_t n, cache->BeforeTurn(static_cast<int>(step), ci, turn, prompt));
  if (n < 0 || n >= static_cast<int64_t>(prompt.size())) {
    return absl::InternalError(absl::StrCat("conversation ", name, " turn ", turn,
                                            ": the turn cache names ", n, " of ", prompt.size(),
                                            " tokens"));
  }
  if (n == 0) {
    RETURN_IF_ERROR(session.Reset());
    return RestoreOutcome{};
  }
  ASSIGN_OR_RETURN(RestoreOutcome r,
                   RestoreSession(session, store, absl::MakeConstSpan(prompt.data(), n)));
  if (r.restored_tokens != n) {
    return absl::InternalError(absl::StrCat("conversation ", name, " turn ", turn,
                                            ": the run's own checkpoint of ", n,
                                            " tokens is gone (restored ", r.restored_tokens,
                                            "); give the model's own registration more room"));
  }
  return r;
}

}  // namespace

absl::StatusOr<WorkloadResult> RunRemoteWorkload(const LanguageModel& model, StateCacheClient* client,
                                                 const std::string& model_id,
                                                 const std::vector<Conversation>& conversations,
                                                 const std::vector<std::pair<int, int>>& schedule,
                                                 RemoteStateStore::Options store_options,
                                                 TurnCache* cache) {
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<RemoteStateStore> store,
                   RemoteStateStore::Create(client, model_id, std::move(store_options)));
  ModelSession session(&model, store.get());
  WorkloadResult result;
  result.description = store->Describe();
  const int vocab = model.config().vocab_size;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<uint8_t>> masks;
  for (const Conversation& c : conversations) {
    tokens.push_back(c.Tokens());
    masks.push_back(ReplyMask(c));
    result.scores.push_back(EmptyScores(c));
  }
  for (size_t step = 0; step < schedule.size(); ++step) {
    const auto& [ci, turn] = schedule[step];
    const Conversation& c = conversations[ci];
    const TurnSpan span = SpanOf(c, turn);
    TurnStats stats;
    stats.conversation = ci;
    stats.turn = turn;
    stats.context_tokens = span.start;
    const Clock::time_point turn_start = Clock::now();
    const std::vector<int32_t> prompt(tokens[ci].begin(), tokens[ci].begin() + span.prompt_end);
    ASSIGN_OR_RETURN(RestoreOutcome restored, RestoreTurn(cache, step, ci, turn, prompt, session,
                                                          *store, c.name));
    if (restored.restored_tokens >= span.prompt_end) {
      return absl::InternalError(absl::StrCat("conversation ", c.name, " turn ", turn,
                                              ": a checkpoint covers the whole prompt"));
    }
    stats.restored_tokens = restored.restored_tokens;
    stats.prefilled_tokens = span.prompt_end - restored.restored_tokens;
    stats.recomputed_tokens = std::max<int64_t>(0, span.start - restored.restored_tokens);
    RETURN_IF_ERROR(RunTurn(session, c, span, restored.restored_tokens, tokens[ci], masks[ci],
                            vocab, &result.scores[ci], turn_start, &stats));
    const std::vector<int32_t> context(tokens[ci].begin(), tokens[ci].begin() + span.end);
    RETURN_IF_ERROR(SnapshotSession(session, *store, context).status());
    if (cache != nullptr) RETURN_IF_ERROR(cache->AfterTurn(step, ci, turn, context));
    stats.turn_ms = MillisSince(turn_start);
    result.turns.push_back(stats);
  }
  result.update_micros = store->update_micros();
  result.wall_seconds = MillisSince(start) / 1e3;
  return result;
}

absl::StatusOr<WorkloadResult> RunFp32Reference(const LanguageModel& model,
                                                const std::vector<Conversation>& conversations,
                                                const std::vector<std::pair<int, int>>& schedule) {
  const Clock::time_point start = Clock::now();
  const ModelGeometry geometry = model.config().Geometry();
  std::vector<std::unique_ptr<Fp32StateStore>> stores;
  std::vector<std::unique_ptr<ModelSession>> sessions;
  WorkloadResult result;
  result.description = "fp32 (in process)";
  const int vocab = model.config().vocab_size;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<uint8_t>> masks;
  for (const Conversation& c : conversations) {
    stores.push_back(std::make_unique<Fp32StateStore>(geometry, model.pool()));
    sessions.push_back(std::make_unique<ModelSession>(&model, stores.back().get()));
    tokens.push_back(c.Tokens());
    masks.push_back(ReplyMask(c));
    result.scores.push_back(EmptyScores(c));
  }
  for (const auto& [ci, turn] : schedule) {
    const Conversation& c = conversations[ci];
    const TurnSpan span = SpanOf(c, turn);
    if (sessions[ci]->position() != span.start) {
      return absl::InvalidArgumentError(absl::StrCat("schedule: conversation ", c.name, " turn ",
                                                     turn, " out of order"));
    }
    TurnStats stats;
    stats.conversation = ci;
    stats.turn = turn;
    stats.context_tokens = span.start;
    stats.restored_tokens = span.start;  // the live session holds the context
    stats.prefilled_tokens = span.prompt_end - span.start;
    const Clock::time_point turn_start = Clock::now();
    RETURN_IF_ERROR(RunTurn(*sessions[ci], c, span, span.start, tokens[ci], masks[ci], vocab,
                            &result.scores[ci], turn_start, &stats));
    stats.turn_ms = MillisSince(turn_start);
    result.turns.push_back(stats);
  }
  result.wall_seconds = MillisSince(start) / 1e3;
  return result;
}

absl::StatusOr<Accuracy> CompareRuns(const WorkloadResult& run, const WorkloadResult& reference) {
  if (run.scores.size() != reference.scores.size()) {
    return absl::InvalidArgumentError(absl::StrCat("runs: ", run.scores.size(), " vs ",
                                                   reference.scores.size(), " conversations"));
  }
  Accuracy a;
  double nll = 0, ref_nll = 0;
  int64_t agree = 0, reply_agree = 0;
  for (size_t c = 0; c < run.scores.size(); ++c) {
    const ConversationScores& x = run.scores[c];
    const ConversationScores& y = reference.scores[c];
    if (x.scored != y.scored) {
      return absl::InvalidArgumentError(
          absl::StrCat("runs: conversation ", c, " scored different positions"));
    }
    for (size_t p = 0; p < x.scored.size(); ++p) {
      if (!x.scored[p]) continue;
      ++a.predicted;
      nll += x.nll_bits[p];
      ref_nll += y.nll_bits[p];
      const bool same = x.argmax[p] == y.argmax[p];
      agree += same;
      if (x.reply[p]) {
        ++a.reply_predicted;
        reply_agree += same;
      }
    }
  }
  if (a.predicted == 0) return absl::InvalidArgumentError("runs: no scored positions");
  a.bits_per_byte = nll / a.predicted;
  a.reference_bits_per_byte = ref_nll / a.predicted;
  a.agreement = static_cast<double>(agree) / a.predicted;
  a.reply_agreement =
      a.reply_predicted > 0 ? static_cast<double>(reply_agree) / a.reply_predicted : 0;
  return a;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * (values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - lo);
}

absl::StatusOr<StateLayout> CalibrateLayout(const LanguageModel& model,
                                            const std::vector<Document>& calibration_docs,
                                            int per_domain, const FormatSpec& format,
                                            std::string* info) {
  if (per_domain < 1) return absl::InvalidArgumentError("per_domain: must be >= 1");
  const Clock::time_point start = Clock::now();
  std::map<std::string, int> taken;
  std::vector<Trajectory> trajectories;
  Fp32StateStore store(model.config().Geometry(), model.pool());
  for (const Document& d : calibration_docs) {
    if (taken[d.domain] >= per_domain) continue;
    ++taken[d.domain];
    ASSIGN_OR_RETURN(Trajectory t, RecordTrajectory(model, &store, d, "statecachectl demo"));
    trajectories.push_back(std::move(t));
  }
  if (trajectories.empty()) return absl::InvalidArgumentError("calibration corpus: no documents");
  CalibrationOptions options;
  options.damp_sr = format.format == StateFormat::kDampSr;
  ASSIGN_OR_RETURN(CalibrationStats stats,
                   Calibrate(TrajectoriesFromVector(&trajectories), options));
  LayoutRequest request;
  request.format = format;
  request.selector = DefaultSelector(format.format);
  ASSIGN_OR_RETURN(BuiltLayout built, BuildLayout(stats, request));
  if (info != nullptr) {
    *info = absl::StrCat(stats.trajectories, " documents (", per_domain, " per domain, ",
                         stats.domains.size(), " domains, ", stats.tokens,
                         " tokens), selector ", SelectorName(request.selector), ", ",
                         absl::StrFormat("%.1f", MillisSince(start) / 1e3), " s");
  }
  return std::move(built.layout);
}

}  // namespace statecache
