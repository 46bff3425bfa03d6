#include "kernels/cuda/launch_options.h"

#include <cstdlib>
#include <string>

namespace statecache {
namespace {

// Unset or empty: `default_on`; otherwise on unless the value starts with '0'.
bool EnvFlag(const char* name, bool default_on) {
  const char* e = std::getenv(name);
  if (e == nullptr || e[0] == '\0') return default_on;
  return e[0] != '0';
}

}  // namespace

LaunchOptions LaunchOptionsFromEnvironment() {
  LaunchOptions o;
  o.programmatic_launch = EnvFlag("STATECACHE_CUDA_PDL", true);
  o.pipeline = EnvFlag("STATECACHE_CUDA_PIPELINE", true);
  const char* stages = std::getenv("STATECACHE_CUDA_STAGES");
  o.forced_stages = stages == nullptr ? 0 : std::atoi(stages);
  o.stepquant_fast = EnvFlag("STATECACHE_STEPQUANT_FAST", true);
  const char* v = std::getenv("STATECACHE_STEPQUANT_VARIANT");
  const std::string variant = v != nullptr ? v : "";
  if (variant == "h2") o.stepquant_variant = StepQuantVariant::kH2;
  if (variant == "c2") o.stepquant_variant = StepQuantVariant::kC2;
  if (variant == "c3") o.stepquant_variant = StepQuantVariant::kC3;
  o.queue_blocking_sync = EnvFlag("STATECACHE_QUEUE_BLOCKING_SYNC", false);
  return o;
}

}  // namespace statecache
