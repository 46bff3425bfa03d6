// Little-endian loads and stores of metadata words inside a packed head
// (FP16 / FP32 scales), for host and device. Device code relies on the
// sections' natural alignment (head_layout.h aligns every section to 16).
#ifndef STATECACHE_KERNELS_FORMATS_PACKED_BYTES_H_
#define STATECACHE_KERNELS_FORMATS_PACKED_BYTES_H_

#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

namespace statecache {

// Aligned little-endian loads/stores of metadata words inside a packed head.
SC_HD uint16_t LoadU16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}
SC_HD void StoreU16(uint8_t* p, uint16_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint16_t*>(p) = v;
#else
  std::memcpy(p, &v, 2);
#endif
}
SC_HD float LoadF32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const float*>(p);
#else
  float v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
SC_HD void StoreF32(uint8_t* p, float v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float*>(p) = v;
#else
  std::memcpy(p, &v, 4);
#endif
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_FORMATS_PACKED_BYTES_H_
