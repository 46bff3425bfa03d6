// ServiceFixture: a StateCacheService on the CPU backend with two small
// registered models ("gdn": GDN damp:8, "kda": KDA int4-hadamard) and a few
// allocated slots, shared by the request and Import fuzz targets, plus the
// properties every input must keep: pool invariants, a failed request
// leaves every slot byte-identical, and every live slot decodes to finite
// states (NaN/Inf are never written).
#ifndef STATECACHE_TESTS_FUZZ_SERVICE_FIXTURE_H_
#define STATECACHE_TESTS_FUZZ_SERVICE_FIXTURE_H_

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "server/core/log.h"
#include "server/core/model_registry.h"
#include "server/statecache_service.h"

namespace statecache {

class ServiceFixture {
 public:
  static ServiceFixture& Get() {
    static ServiceFixture* f = new ServiceFixture();
    return *f;
  }

  StateCacheService& service() { return *service_; }
  Tenant& caller() { return service_->default_tenant(); }
  std::shared_ptr<Model> model(int i) { return registry_->Find(i == 0 ? "gdn" : "kda").value(); }
  const std::vector<SlotHandle>& slots(int i) { return slots_[i]; }

  // All slot bytes of both models.
  std::string ArenaBytes() {
    std::string out;
    for (int i = 0; i < 2; ++i) {
      const PoolView& v = model(i)->slots->view();
      out.append(reinterpret_cast<const char*>(v.base), v.num_slots * v.slot_bytes());
    }
    return out;
  }

  // Aborts (a fuzzer finding) when a property is broken.
  void Check(const absl::Status& status, const std::string& before) {
    for (int i = 0; i < 2; ++i) {
      std::shared_ptr<Model> m = model(i);
      Require(m->slots->CheckInvariants(), "slot pool invariants");
      if (m->checkpoints) Require(m->checkpoints->CheckInvariants(), "checkpoint invariants");
    }
    if (!status.ok() && ArenaBytes() != before) {
      std::fprintf(stderr, "failed request (%s) modified slot bytes\n", status.ToString().c_str());
      std::abort();
    }
    for (int i = 0; i < 2; ++i) {
      std::shared_ptr<Model> m = model(i);
      const ModelGeometry& g = m->layout.geometry();
      const int64_t values = g.HeadsPerSlot() * g.d_k * g.d_v;
      std::vector<float> states(values);
      for (int32_t s = 0; s < m->slots->capacity(); ++s) {
        Require(backend_->UnpackStates(*m->prepared, m->slots->view(), &s, 1, states.data()),
                "unpack");
        for (float x : states) {
          if (!std::isfinite(x)) {
            std::fprintf(stderr, "non-finite state written to slot %d of model %d\n", s, i);
            std::abort();
          }
        }
      }
    }
  }

 private:
  ServiceFixture() {
    SetLoggingEnabled(false);
    backend_ = CpuBackend::Create({/*threads=*/1});
    ModelRegistry::Options ro;
    ro.state_budget_bytes = 8 << 20;
    ro.checkpoint_budget_bytes = 8 << 20;
    registry_ = std::make_unique<ModelRegistry>(backend_.get(), ro);
    StateCacheService::Limits limits;
    limits.max_batch = 8;
    limits.max_allocate = 8;
    limits.max_prefill_tokens = 16;
    limits.max_aux_bytes = 4096;
    limits.max_lookup_tokens = 256;
    limits.max_work_heads = 64;
    service_ =
        std::make_unique<StateCacheService>(backend_.get(), registry_.get(), nullptr, limits);
    const char* ids[] = {"gdn", "kda"};
    const ModelGeometry geos[] = {{Arch::kGdn, 2, 1, 2, 32, 32}, {Arch::kKda, 1, 2, 2, 32, 32}};
    const char* formats[] = {"damp:8", "int4-hadamard"};
    for (int i = 0; i < 2; ++i) {
      ModelSpec spec;
      spec.id = ids[i];
      spec.geometry = geos[i];
      spec.format = ParseFormatSpec(formats[i]).value();
      spec.slots = 4;
      spec.checkpoints = 3;
      std::shared_ptr<Model> m = registry_->Register(spec).value();
      slots_[i] = m->slots->Allocate(2).value();
    }
  }
  static void Require(const absl::Status& s, const char* what) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
      std::abort();
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<StateCacheService> service_;
  std::vector<SlotHandle> slots_[2];
};

}  // namespace statecache

#endif  // STATECACHE_TESTS_FUZZ_SERVICE_FIXTURE_H_
