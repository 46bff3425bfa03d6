#include "server/core/update_coalescer.h"

#include <cstring>
#include <utility>
#include <vector>

namespace statecache {
namespace {

// Appends `bytes` of `src` to `dst`.
void Append(std::vector<uint8_t>* dst, const void* src, int64_t bytes) {
  const size_t at = dst->size();
  dst->resize(at + static_cast<size_t>(bytes));
  if (bytes > 0) std::memcpy(dst->data() + at, src, static_cast<size_t>(bytes));
}

}  // namespace

UpdateCoalescer::Group* UpdateCoalescer::GroupOf(const Key& key) {
  absl::MutexLock lock(&groups_mu_);
  std::unique_ptr<Group>& g = groups_[key];
  if (g == nullptr) g = std::make_unique<Group>();
  return g.get();
}

absl::Status UpdateCoalescer::Run(const PreparedModel& model, const PoolView& pool, int layer,
                                  const HostUpdate& u, Launch* launch) {
  Pending p;
  p.update = &u;
  if (u.batch >= options_.max_batch) {
    // Alone: too large to share a launch.
    std::vector<Pending*> one = {&p};
    Execute(one, model, pool, layer);
    absl::MutexLock stats(&stats_mu_);
    ++launches_;
    ++calls_;
    *launch = p.launch;
    return p.status;
  }
  Group& g = *GroupOf(Key{&model, pool.base, layer, static_cast<int>(u.dtype)});
  {
    absl::MutexLock lock(&g.mu);
    g.queue.push_back(&p);
    g.queued_slots += u.batch;
    if (!g.running) {
      g.running = true;  // the queue was empty: p is its front
      p.lead = true;
    } else {
      g.mu.Await(absl::Condition(
          +[](Pending* q) { return q->done || q->lead; }, &p));
    }
  }
  if (!p.done) Lead(g, model, pool, layer);
  *launch = p.launch;
  return p.status;
}

void UpdateCoalescer::Lead(Group& g, const PreparedModel& model, const PoolView& pool, int layer) {
  std::vector<Pending*> batch;
  {
    absl::MutexLock lock(&g.mu);
    if (options_.max_delay > absl::ZeroDuration()) {
      std::pair<Group*, int64_t> want(&g, options_.max_batch);
      g.mu.AwaitWithTimeout(absl::Condition(
                                +[](std::pair<Group*, int64_t>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                  return a->first->queued_slots >= a->second;
                                },
                                &want),
                            options_.max_delay);
    }
    int64_t slots = 0;
    while (!g.queue.empty()) {
      Pending* next = g.queue.front();
      if (!batch.empty() && slots + next->update->batch > options_.max_batch) break;
      slots += next->update->batch;
      batch.push_back(next);
      g.queue.pop_front();
    }
    g.queued_slots -= slots;
  }
  const int launches = Execute(batch, model, pool, layer);
  {
    absl::MutexLock stats(&stats_mu_);
    launches_ += launches;
    calls_ += static_cast<int64_t>(batch.size());
  }
  absl::MutexLock lock(&g.mu);
  for (Pending* q : batch) q->done = true;
  if (g.queue.empty()) {
    g.running = false;
  } else {
    g.queue.front()->lead = true;
  }
}

int UpdateCoalescer::Execute(const std::vector<Pending*>& batch, const PreparedModel& model,
                              const PoolView& pool, int layer) {
  Launch launch;
  launch.calls = static_cast<int>(batch.size());
  for (const Pending* q : batch) launch.batch += q->update->batch;
  if (batch.size() == 1) {
    Pending& q = *batch[0];
    q.status = RunHostUpdate(*backend_, *staging_, model, pool, layer, *q.update,
                             &launch.kernel_seconds);
    q.launch = launch;
    q.launch.leader = true;
    return 1;
  }
  const DType dtype = batch[0]->update->dtype;
  const HostUpdateRow row = RowBytesOf(model.layout().geometry(), dtype);
  std::vector<uint8_t> slots, q, k, v, g, beta;
  for (const Pending* p : batch) {
    const HostUpdate& u = *p->update;
    const int64_t b = u.batch;
    Append(&slots, u.slots, b * row.slot);
    Append(&q, u.q, b * row.qk);
    Append(&k, u.k, b * row.qk);
    Append(&v, u.v, b * row.v);
    Append(&g, u.g, b * row.g);
    Append(&beta, u.beta, b * row.beta);
  }
  std::vector<float> o(static_cast<size_t>(launch.batch * row.o / 4));
  HostUpdate merged;
  merged.batch = launch.batch;
  merged.dtype = dtype;
  merged.slots = reinterpret_cast<const int32_t*>(slots.data());
  merged.q = q.data();
  merged.k = k.data();
  merged.v = v.data();
  merged.g = reinterpret_cast<const float*>(g.data());
  merged.beta = reinterpret_cast<const float*>(beta.data());
  merged.o = o.data();
  const absl::Status st =
      RunHostUpdate(*backend_, *staging_, model, pool, layer, merged, &launch.kernel_seconds);
  if (st.code() == absl::StatusCode::kInvalidArgument) {
    // Nothing was written: each call alone, with its own verdict.
    for (size_t i = 0; i < batch.size(); ++i) {
      Pending& p = *batch[i];
      Launch alone;
      alone.calls = 1;
      alone.batch = p.update->batch;
      alone.leader = true;
      p.status = RunHostUpdate(*backend_, *staging_, model, pool, layer, *p.update,
                               &alone.kernel_seconds);
      p.launch = alone;
    }
    return 1 + static_cast<int>(batch.size());
  }
  int64_t at = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Pending& p = *batch[i];
    const int64_t bytes = p.update->batch * row.o;
    if (st.ok()) std::memcpy(p.update->o, reinterpret_cast<uint8_t*>(o.data()) + at, bytes);
    at += bytes;
    p.status = st;
    p.launch = launch;
    p.launch.leader = i == 0;
  }
  return 1;
}

int64_t UpdateCoalescer::launches() const {
  absl::MutexLock lock(&stats_mu_);
  return launches_;
}

int64_t UpdateCoalescer::calls() const {
  absl::MutexLock lock(&stats_mu_);
  return calls_;
}

}  // namespace statecache
