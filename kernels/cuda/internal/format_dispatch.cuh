// The CUDA kernels' format switch, derived from the format table
// (kernels/formats/format.h, STATECACHE_FORMAT_TABLE): a launcher passes a
// runtime StateFormat and a generic callable and gets the callable run with
// the format as a compile-time constant, for the formats of the CUDA units
// it compiles (FormatTraits::unit) only.
//
//   return DispatchFormat<CudaUnit::kRecurrence>(p.geo.format, [&](auto f) {
//     return Launch<decltype(f)::value>(p, stream);
//   });
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_FORMAT_DISPATCH_CUH_
#define STATECACHE_KERNELS_CUDA_INTERNAL_FORMAT_DISPATCH_CUH_

#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/formats/format.h"

namespace statecache {
namespace cuda_internal {

// fn(std::integral_constant<StateFormat, f>{}) when f is a row of the table
// whose unit is one of kUnits (only those are instantiated);
// cudaErrorInvalidValue otherwise.
template <CudaUnit... kUnits, typename Fn>
int DispatchFormat(StateFormat f, Fn&& fn) {
  switch (f) {
#define STATECACHE_DISPATCH_FORMAT(e, ...)                                             \
  case StateFormat::e:                                                                 \
    if constexpr (((TraitsOf(StateFormat::e).unit == kUnits) || ...)) {                \
      return fn(std::integral_constant<StateFormat, StateFormat::e>{});                \
    } else {                                                                           \
      return cudaErrorInvalidValue;                                                    \
    }
    STATECACHE_FORMAT_TABLE(STATECACHE_DISPATCH_FORMAT)
#undef STATECACHE_DISPATCH_FORMAT
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_FORMAT_DISPATCH_CUH_
