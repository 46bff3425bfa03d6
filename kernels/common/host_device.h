// Portability macros for code shared by host C++ and CUDA device code.
//
// Headers that hold math both the CPU reference and the CUDA kernels run (the
// quantizers, the Hadamard transform, the packed-head layout) mark their
// functions SC_HD, so nvcc compiles them for both sides and g++ sees plain
// inline functions. No other CUDA-specific syntax may appear in such headers.
#ifndef STATECACHE_KERNELS_COMMON_HOST_DEVICE_H_
#define STATECACHE_KERNELS_COMMON_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define SC_HD __host__ __device__ __forceinline__
#define SC_HD_CONSTEXPR __host__ __device__ constexpr
#else
#define SC_HD inline
#define SC_HD_CONSTEXPR constexpr
#endif

#endif  // STATECACHE_KERNELS_COMMON_HOST_DEVICE_H_
