#include "kernels/cuda/launch_options.h"

#include <cstdlib>
#include <string>

namespace statecache {
namespace {

// A flag is on unless set to a value starting with '0'.
bool EnvFlagOn(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || e[0] != '0';
}

// A flag that is off unless set to a value not starting with '0'.
bool EnvFlagSet(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && e[0] != '\0' && e[0] != '0';
}

}  // namespace

LaunchOptions LaunchOptionsFromEnvironment() {
  LaunchOptions o;
  o.programmatic_launch = EnvFlagOn("STATECACHE_CUDA_PDL");
  o.pipeline = EnvFlagOn("STATECACHE_CUDA_PIPELINE");
  const char* stages = std::getenv("STATECACHE_CUDA_STAGES");
  o.forced_stages = stages == nullptr ? 0 : std::atoi(stages);
  o.stepquant_fast = EnvFlagOn("STATECACHE_STEPQUANT_FAST");
  const char* v = std::getenv("STATECACHE_STEPQUANT_VARIANT");
  const std::string variant = v != nullptr ? v : "";
  if (variant == "h2") o.stepquant_variant = StepQuantVariant::kH2;
  if (variant == "c2") o.stepquant_variant = StepQuantVariant::kC2;
  if (variant == "c3") o.stepquant_variant = StepQuantVariant::kC3;
  o.queue_blocking_sync = EnvFlagSet("STATECACHE_QUEUE_BLOCKING_SYNC");
  return o;
}

}  // namespace statecache
