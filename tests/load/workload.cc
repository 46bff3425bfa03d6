#include "tests/load/workload.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"

namespace statecache {

void WorkloadStats::Add(const WorkloadStats& o) {
  requests += o.requests;
  for (const auto& [code, n] : o.errors_by_code) errors_by_code[code] += n;
  latencies_us.insert(latencies_us.end(), o.latencies_us.begin(), o.latencies_us.end());
  restores += o.restores;
  recomputes += o.recomputes;
  acknowledged_updates += o.acknowledged_updates;
}

double WorkloadStats::PercentileUs(double p) const {
  if (latencies_us.empty()) return 0;
  std::vector<double> v = latencies_us;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

UpdateCall DecodeCallOf(const OpInputs& in, int layer, SlotHandle slot) {
  UpdateCall call;
  call.layer = layer;
  call.slots = {slot};
  call.q = HostTensor::Fp32(in.q);
  call.k = HostTensor::Fp32(in.k);
  call.v = HostTensor::Fp32(in.v);
  call.g = in.g;
  call.beta = in.beta;
  return call;
}

uint64_t DigestFloats(uint64_t h, const std::vector<float>& values) {
  for (float f : values) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    for (int b = 0; b < 4; ++b) {
      h ^= (bits >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

uint64_t SeedOf(const WorkloadSpec& spec, int64_t conversation, int turn, int op, int layer) {
  uint64_t h = Mix(spec.seed + 0x9e3779b97f4a7c15ull);
  for (uint64_t part : {static_cast<uint64_t>(conversation), static_cast<uint64_t>(turn),
                        static_cast<uint64_t>(op), static_cast<uint64_t>(layer)}) {
    h = Mix(h ^ (part + 0x9e3779b97f4a7c15ull));
  }
  return h;
}

// Token ids of the first `n` tokens of a conversation.
std::vector<int32_t> TokensOf(const WorkloadSpec& spec, int64_t conversation, int64_t n) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] =
        static_cast<int32_t>(SeedOf(spec, conversation, -1, static_cast<int>(i), 0) & 0x7fffffff);
  }
  return ids;
}

// Times one call into stats.
template <typename F>
auto Timed(WorkloadStats* stats, F&& f) {
  const absl::Time start = absl::Now();
  auto result = f();
  stats->latencies_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  ++stats->requests;
  return result;
}

class Conversation {
 public:
  Conversation(StateCacheClient& client, const WorkloadSpec& spec, int64_t conversation,
               WorkloadStats* stats)
      : client_(client), spec_(spec), conv_(conversation), stats_(stats) {}

  // Runs the operations of `turn` on `slot`; folds outputs into the digest
  // when `record`.
  absl::Status RunTurnOps(int turn, SlotHandle slot, bool record) {
    const ModelGeometry& g = spec_.geometry;
    for (int layer = 0; layer < g.layers; ++layer) {
      OpInputs in = MakeOpInputs(spec_, conv_, turn, 0, layer, spec_.prefill_tokens);
      PrefillCall call;
      call.layer = layer;
      call.tokens = spec_.prefill_tokens;
      call.slots = {slot};
      call.q = HostTensor::Fp32(in.q);
      call.k = HostTensor::Fp32(in.k);
      call.v = HostTensor::Fp32(in.v);
      call.g = in.g;
      call.beta = in.beta;
      call.want_output = true;
      absl::StatusOr<std::vector<float>> o =
          Timed(stats_, [&] { return client_.Prefill(spec_.model_id, call); });
      if (!o.ok()) return o.status();
      if (record) digest_ = DigestFloats(digest_, *o);
    }
    for (int step = 1; step <= spec_.decode_steps; ++step) {
      for (int layer = 0; layer < g.layers; ++layer) {
        const OpInputs in = MakeOpInputs(spec_, conv_, turn, step, layer, 1);
        const UpdateCall call = DecodeCallOf(in, layer, slot);
        absl::StatusOr<std::vector<float>> o = Timed(stats_, [&] {
          return stream_ ? stream_->Update(spec_.model_id, call)
                         : client_.Update(spec_.model_id, call);
        });
        if (!o.ok()) return o.status();
        ++stats_->acknowledged_updates;
        if (record) digest_ = DigestFloats(digest_, *o);
      }
    }
    return absl::OkStatus();
  }

  absl::Status RunTurn(int turn) {
    absl::StatusOr<std::vector<SlotHandle>> slots =
        Timed(stats_, [&] { return client_.AllocateSlots(spec_.model_id, 1); });
    if (!slots.ok()) return slots.status();
    const SlotHandle slot = (*slots)[0];
    absl::Status s = [&]() -> absl::Status {
      const int64_t per_turn = spec_.prefill_tokens + spec_.decode_steps;
      if (turn > 0) {
        const std::vector<int32_t> history = TokensOf(spec_, conv_, per_turn * turn);
        absl::StatusOr<PrefixLookup> hit =
            Timed(stats_, [&] { return client_.LookupPrefix(spec_.model_id, history); });
        if (!hit.ok()) return hit.status();
        bool restored = false;
        if (hit->hit && hit->key.num_tokens == static_cast<int64_t>(history.size())) {
          absl::StatusOr<RestoredCheckpoint> r = Timed(stats_, [&] {
            return client_.Restore(spec_.model_id, slot, hit->key, hit->lease_id);
          });
          if (r.ok()) {
            restored = true;
          } else if (r.status().code() != absl::StatusCode::kNotFound) {
            return r.status();
          }
        }
        if (restored) {
          ++stats_->restores;
        } else {
          ++stats_->recomputes;
          for (int t = 0; t < turn; ++t) RETURN_IF_ERROR(RunTurnOps(t, slot, /*record=*/false));
        }
      }
      RETURN_IF_ERROR(RunTurnOps(turn, slot, /*record=*/true));
      const std::vector<int32_t> upto = TokensOf(spec_, conv_, per_turn * (turn + 1));
      absl::StatusOr<PrefixKey> key =
          Timed(stats_, [&] { return client_.Snapshot(spec_.model_id, slot, upto); });
      return key.status();
    }();
    const SlotHandle release[] = {slot};
    absl::Status released =
        Timed(stats_, [&] { return client_.ReleaseSlots(spec_.model_id, release); });
    if (!released.ok()) stats_->Error(released);
    return s.ok() ? released : s;
  }

  ConversationResult Run() {
    ConversationResult r;
    if (spec_.use_stream) {
      absl::StatusOr<std::unique_ptr<UpdateStream>> stream = client_.OpenUpdateStream();
      if (!stream.ok()) {
        r.status = stream.status();
        stats_->Error(r.status);
        return r;
      }
      stream_ = std::move(*stream);
    }
    for (int turn = 0; turn < spec_.turns; ++turn) {
      r.status = RunTurn(turn);
      if (!r.status.ok()) break;
      ++r.turns_done;
    }
    if (stream_) {
      absl::Status fin = stream_->Finish();
      if (r.status.ok() && !fin.ok()) r.status = fin;
    }
    if (!r.status.ok()) stats_->Error(r.status);
    r.digest = digest_;
    return r;
  }

 private:
  StateCacheClient& client_;
  const WorkloadSpec& spec_;
  const int64_t conv_;
  WorkloadStats* stats_;
  std::unique_ptr<UpdateStream> stream_;
  uint64_t digest_ = 14695981039346656037ull;
};

}  // namespace

OpInputs MakeOpInputs(const WorkloadSpec& spec, int64_t conversation, int turn, int op, int layer,
                      int tokens) {
  const ModelGeometry& g = spec.geometry;
  std::mt19937_64 rng(SeedOf(spec, conversation, turn, op, layer));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.05f, 0.95f);
  OpInputs in;
  auto unit_rows = [&](std::vector<float>* out, int64_t rows, int dim) {
    out->resize(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double norm = 0;
      for (int j = 0; j < dim; ++j) {
        float x = normal(rng);
        (*out)[r * dim + j] = x;
        norm += double{x} * x;
      }
      for (int j = 0; j < dim; ++j) (*out)[r * dim + j] /= static_cast<float>(std::sqrt(norm));
    }
  };
  unit_rows(&in.q, int64_t{tokens} * g.h_qk, g.d_k);
  unit_rows(&in.k, int64_t{tokens} * g.h_qk, g.d_k);
  in.v.resize(int64_t{tokens} * g.h_v * g.d_v);
  for (float& x : in.v) x = normal(rng);
  in.g.resize(int64_t{tokens} * g.h_v * g.GateWidth());
  for (float& x : in.g) x = -0.3f * unit(rng);
  in.beta.resize(int64_t{tokens} * g.h_v);
  for (float& x : in.beta) x = unit(rng);
  return in;
}

absl::Status RegisterWorkloadModel(StateCacheClient& client, const WorkloadSpec& spec) {
  ModelRegistration r;
  r.model_id = spec.model_id;
  r.geometry = spec.geometry;
  r.format = spec.format;
  r.slots = spec.slots;
  r.checkpoints = spec.checkpoints;
  absl::StatusOr<v1::ModelInfo> info = client.RegisterModel(r);
  if (info.status().code() == absl::StatusCode::kAlreadyExists) return absl::OkStatus();
  return info.status();
}

ConversationResult RunConversation(StateCacheClient& client, const WorkloadSpec& spec,
                                   int64_t conversation, WorkloadStats* stats) {
  return Conversation(client, spec, conversation, stats).Run();
}

}  // namespace statecache
