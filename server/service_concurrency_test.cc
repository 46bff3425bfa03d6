// Concurrency test of StateCacheService without gRPC: many threads call the
// handlers on one model at once (updates, prefills, snapshots, lookups,
// restores, export/import, allocate/release churn, stats, slot-lease sweeps),
// and concurrent Updates on distinct slots (with and without coalescing)
// give the bytes of the same calls run serially.
// Written for ThreadSanitizer (bazel test --config=tsan): every thread is
// ours, so every access is checked. Also run in the default suite: no call
// fails unexpectedly and the pool invariants hold afterwards.
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/core/log.h"
#include "server/core/model_registry.h"
#include "server/core/proto_convert.h"
#include "server/statecache_service.h"

namespace statecache {
namespace {

void SetTensor(std::vector<int64_t> shape, std::mt19937* rng, float scale, v1::Tensor* t) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_shape(d);
    n *= d;
  }
  std::vector<float> v(n);
  for (float& x : v) x = scale * u(*rng);
  t->set_dtype(v1::DTYPE_FP32);
  t->set_data(std::string(reinterpret_cast<const char*>(v.data()), n * 4));
}

TEST(ServiceConcurrencyTest, ManyThreadsOnOneModel) {
  SetLoggingEnabled(false);
  std::unique_ptr<Backend> backend = CpuBackend::Create({/*threads=*/2});
  ModelRegistry::Options ro;
  ro.state_budget_bytes = 8 << 20;
  ro.checkpoint_budget_bytes = 8 << 20;
  ModelRegistry registry(backend.get(), ro);
  StateCacheService service(backend.get(), &registry, nullptr, {});
  Tenant& caller = service.default_tenant();
  v1::RegisterModelRequest reg;
  reg.set_model_id("m");
  reg.set_format("damp:8");
  *reg.mutable_geometry() = GeometryToProto({Arch::kGdn, 2, 1, 2, 32, 32});
  reg.set_slots(24);
  reg.set_checkpoints(6);
  v1::RegisterModelResponse info;
  ASSERT_TRUE(service.DoRegisterModel(caller, reg, &info).ok());
  std::shared_ptr<Model> model = registry.Find("m").value();

  constexpr int kThreads = 6, kIters = 40;
  std::atomic<int> unexpected{0};
  std::atomic<bool> stop{false};
  auto expect = [&](const absl::Status& s, std::initializer_list<absl::StatusCode> allowed,
                    const char* what) {
    if (s.ok()) return;
    for (absl::StatusCode c : allowed) {
      if (s.code() == c) return;
    }
    ++unexpected;
    ADD_FAILURE() << what << ": " << s;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      v1::AllocateSlotsRequest alloc;
      alloc.set_model_id("m");
      alloc.set_count(2);
      v1::AllocateSlotsResponse mine;
      expect(service.DoAllocateSlots(caller, alloc, &mine), {}, "allocate");
      if (mine.slots_size() != 2) return;
      for (int i = 0; i < kIters; ++i) {
        v1::UpdateRequest u;
        u.set_model_id("m");
        u.set_layer(i % 2);
        *u.add_slots() = mine.slots(0);
        *u.add_slots() = mine.slots(1);
        SetTensor({2, 1, 32}, &rng, 0.17f, u.mutable_q());
        SetTensor({2, 1, 32}, &rng, 0.17f, u.mutable_k());
        SetTensor({2, 2, 32}, &rng, 1.f, u.mutable_v());
        SetTensor({2, 2}, &rng, 0.f, u.mutable_g());
        SetTensor({2, 2}, &rng, 0.f, u.mutable_beta());
        v1::UpdateResponse o;
        expect(service.DoUpdate(caller, u, &o), {}, "update");
        // Shared keys: threads replace, evict and restore each other's entries.
        v1::SnapshotRequest sn;
        sn.set_model_id("m");
        *sn.mutable_slot() = mine.slots(0);
        sn.mutable_tokens()->add_ids(1 + (i + t) % 8);
        v1::SnapshotResponse snr;
        expect(service.DoSnapshot(caller, sn, &snr), {absl::StatusCode::kResourceExhausted},
               "snapshot");
        v1::LookupPrefixRequest lk;
        lk.set_model_id("m");
        lk.mutable_tokens()->add_ids(1 + (i * 3 + t) % 8);
        v1::LookupPrefixResponse hit;
        expect(service.DoLookupPrefix(caller, lk, &hit), {}, "lookup");
        if (hit.hit()) {
          v1::RestoreRequest r;
          r.set_model_id("m");
          *r.mutable_slot() = mine.slots(1);
          *r.mutable_key() = hit.key();
          r.set_lease_id(hit.lease_id());
          v1::RestoreResponse rr;
          expect(service.DoRestore(caller, r, &rr), {}, "restore");
        }
        v1::ExportRequest ex;
        ex.set_model_id("m");
        *ex.mutable_slot() = mine.slots(1);
        v1::ExportResponse exr;
        expect(service.DoExport(caller, ex, &exr), {}, "export");
        v1::ImportRequest im;
        im.set_model_id("m");
        *im.mutable_slot() = mine.slots(0);
        *im.mutable_tags() = exr.tags();
        im.set_packed(exr.packed());
        expect(service.DoImport(caller, im), {}, "import");
        // Churn: a short-lived slot.
        v1::AllocateSlotsRequest one;
        one.set_model_id("m");
        one.set_count(1);
        v1::AllocateSlotsResponse tmp;
        absl::Status a = service.DoAllocateSlots(caller, one, &tmp);
        expect(a, {absl::StatusCode::kResourceExhausted}, "churn allocate");
        if (a.ok()) {
          v1::ReleaseSlotsRequest rel;
          rel.set_model_id("m");
          *rel.mutable_slots() = tmp.slots();
          expect(service.DoReleaseSlots(caller, rel), {}, "churn release");
        }
      }
      v1::ReleaseSlotsRequest rel;
      rel.set_model_id("m");
      *rel.mutable_slots() = mine.slots();
      expect(service.DoReleaseSlots(caller, rel), {}, "release");
    });
  }
  std::thread observer([&] {
    while (!stop.load()) {
      v1::GetStatsResponse st;
      expect(service.DoGetStats(caller, v1::GetStatsRequest(), &st), {}, "stats");
      // A sweep with a cutoff in the past releases nothing that is in use.
      model->slots->ReleaseIdle(absl::Now() - absl::Hours(1));
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  for (auto& th : threads) th.join();
  stop = true;
  observer.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_TRUE(model->slots->CheckInvariants().ok()) << model->slots->CheckInvariants();
  EXPECT_TRUE(model->checkpoints->CheckInvariants().ok());
  EXPECT_EQ(model->slots->stats().allocated, 0);
}

// Updates of many threads on distinct slots (unary-style DoUpdate calls
// interleaved however the scheduler likes), with and without coalescing:
// every slot's final packed bytes and every o equal the same calls run one
// after another on a fresh model.
void ConcurrentUpdatesMatchSerial(bool coalesce) {
  SetLoggingEnabled(false);
  std::unique_ptr<Backend> backend = CpuBackend::Create({/*threads=*/2});
  ModelRegistry::Options ro;
  ro.state_budget_bytes = 8 << 20;
  ro.checkpoint_budget_bytes = 1 << 20;
  ModelRegistry registry(backend.get(), ro);
  StateCacheService::ComputeOptions compute;
  compute.coalesce_updates = coalesce;
  compute.coalescer.max_batch = 4;
  StateCacheService service(backend.get(), &registry, nullptr, {}, compute);
  Tenant& caller = service.default_tenant();
  const ModelGeometry geo{Arch::kGdn, 2, 1, 2, 32, 32};
  for (const char* id : {"live", "serial"}) {
    v1::RegisterModelRequest reg;
    reg.set_model_id(id);
    reg.set_format("damp:8");
    *reg.mutable_geometry() = GeometryToProto(geo);
    reg.set_slots(8);
    reg.set_checkpoints(1);
    v1::RegisterModelResponse info;
    ASSERT_TRUE(service.DoRegisterModel(caller, reg, &info).ok());
  }
  constexpr int kThreads = 8, kSteps = 12;
  // Inputs of thread t, step i (the layer alternates).
  auto request = [&](const char* model, const v1::SlotHandle& slot, int t, int i) {
    std::mt19937 rng(1000 * t + i);
    v1::UpdateRequest u;
    u.set_model_id(model);
    u.set_layer(i % 2);
    *u.add_slots() = slot;
    SetTensor({1, 1, 32}, &rng, 0.17f, u.mutable_q());
    SetTensor({1, 1, 32}, &rng, 0.17f, u.mutable_k());
    SetTensor({1, 2, 32}, &rng, 1.f, u.mutable_v());
    SetTensor({1, 2}, &rng, 0.f, u.mutable_g());
    SetTensor({1, 2}, &rng, 0.f, u.mutable_beta());
    return u;
  };
  auto allocate = [&](const char* model) {
    v1::AllocateSlotsRequest a;
    a.set_model_id(model);
    a.set_count(kThreads);
    v1::AllocateSlotsResponse r;
    EXPECT_TRUE(service.DoAllocateSlots(caller, a, &r).ok());
    return r;
  };
  auto exported = [&](const char* model, const v1::SlotHandle& slot) {
    v1::ExportRequest ex;
    ex.set_model_id(model);
    *ex.mutable_slot() = slot;
    v1::ExportResponse r;
    EXPECT_TRUE(service.DoExport(caller, ex, &r).ok());
    return r.packed();
  };
  const v1::AllocateSlotsResponse live = allocate("live");
  ASSERT_EQ(live.slots_size(), kThreads);
  std::vector<std::vector<std::string>> outputs(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kSteps; ++i) {
        v1::UpdateResponse o;
        absl::Status s = service.DoUpdate(caller, request("live", live.slots(t), t, i), &o);
        if (!s.ok()) {
          ++failed;
          ADD_FAILURE() << "thread " << t << " step " << i << ": " << s;
        }
        outputs[t].push_back(o.o().data());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failed.load(), 0);
  const v1::AllocateSlotsResponse serial = allocate("serial");
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kSteps; ++i) {
      v1::UpdateResponse o;
      ASSERT_TRUE(service.DoUpdate(caller, request("serial", serial.slots(t), t, i), &o).ok());
      EXPECT_EQ(o.o().data(), outputs[t][i]) << "o of thread " << t << " step " << i;
    }
    EXPECT_EQ(exported("serial", serial.slots(t)), exported("live", live.slots(t)))
        << "state of thread " << t;
  }
}

TEST(ServiceConcurrencyTest, ConcurrentUpdatesMatchSerial) { ConcurrentUpdatesMatchSerial(false); }
TEST(ServiceConcurrencyTest, CoalescedConcurrentUpdatesMatchSerial) {
  ConcurrentUpdatesMatchSerial(true);
}

}  // namespace
}  // namespace statecache
