// Parameters and host launchers of the STEPQuant (stepquant-6 / stepquant-4)
// CUDA kernels (kernels/cuda/internal/stepquant_kernel.cu; design note in
// kernels/stepquant/README.md). No CUDA types here: the binding
// (cuda_backend.cc) fills StepKernelParams from its prepared model and
// validates every input first; launchers trust them.
//
// Exactness contract (except the tiled decode kernel, see
// LaunchStepTileDecode): the packed bytes equal the CPU backend's
// (kernels/cpu/cpu_backend.cc: StepDecodeHead, HeadStep, StepEncodeHead). The
// codec uses the shared element functions of kernels/formats/stepquant_codec.h
// in the reference's order (maxima are order-free; the column least-squares
// sums run serially per column in stored row order with the 64-row chunk
// partials). The recurrence runs one thread per value column over the stored
// rows in order, with the products and sums of the CPU build of HeadStep
// (GCC, -march=x86-64-v3, which contracts `acc += a * b` to fmaf), and the
// decays exp(g) are GlibcExpf (kernels/cuda/glibc_expf.h), bit-equal to the
// CPU's std::exp (glibc expf, FMA variant). Residual risk, counted by the
// tests (kernels/cuda/stepquant_cuda_test.cc): a CPU build that contracts
// HeadStep differently, or a host glibc that dispatches its non-FMA expf
// (rare last-bit differences).
#ifndef STATECACHE_KERNELS_CUDA_INTERNAL_STEPQUANT_PARAMS_H_
#define STATECACHE_KERNELS_CUDA_INTERNAL_STEPQUANT_PARAMS_H_

#include <cstdint>

#include "kernels/cuda/launch_options.h"
#include "kernels/formats/stepquant_codec.h"

namespace statecache {
namespace cuda_internal {

struct StepKernelParams {
  // Geometry.
  int layers = 0;
  int h_qk = 0;
  int h_v = 0;
  int d_k = 0;
  int d_v = 0;
  bool kda = false;
  float scale = 0.0f;                  // readout scale applied to q
  // Layout (device memory, all layers).
  const StepHeadLayout* heads = nullptr;  // [layers * h_v]
  const float* row_impact = nullptr;      // [layers * h_v * d_k], stored order
  const int64_t* head_offsets = nullptr;  // [layers * h_v], bytes inside a slot
  const int32_t* key_perm = nullptr;      // [layers * h_v * d_k] or nullptr (identity)
  // Pool.
  uint8_t* pool_base = nullptr;
  int64_t slot_stride = 0;  // bytes from one slot to the next (PoolView::stride())
  // Decode / prefill (one CTA per (batch item, value head) of `layer`).
  int layer = 0;
  int batch = 0;
  int tokens = 1;
  const int32_t* slots = nullptr;  // [batch] (recurrence) or [n] (pack), -1 = skip
  int dtype = 0;                   // DType of q, k, v
  const void* q = nullptr;         // [batch, tokens, h_qk, d_k]
  const void* k = nullptr;
  const void* v = nullptr;         // [batch, tokens, h_v, d_v]
  const float* g = nullptr;        // [batch, tokens, h_v] (GDN) or [.., h_v, d_k] (KDA)
  const float* beta = nullptr;     // [batch, tokens, h_v]
  float* o = nullptr;              // [batch, tokens, h_v, d_v] or nullptr
  const int32_t* abort_if_error = nullptr;  // validation block or nullptr
  // Pack / unpack (one CTA per (slot entry, layer, head)).
  int n = 0;
  float* states = nullptr;         // [n][layers][h_v][d_k][d_v], natural key order
};

// Dynamic shared memory one CTA needs for a d_k x d_v head, and whether it
// fits the device's opt-in limit (227 KiB on sm_90).
int64_t StepSharedBytes(int d_k, int d_v);
bool StepShapeSupported(int d_k, int d_v);

// Each returns a cudaError_t value as int (0 = success); asynchronous on
// `stream` (a cudaStream_t as void*).
// Decode / prefill. Decode steps (tokens == 1) of 128 x 128 heads with
// 16-byte aligned pool, inputs and maps (StepFastDecodeEligible) take the
// kernel of o.stepquant_variant: the tiled kernel (StepTileDecodeKernel,
// below; kTile, the default) or a build of the fast kernel
// (StepFastDecodeKernel: persistent CTAs, a thread per value column - or per
// half column - in registers, bulk-copy prefetch; kH2, kC2, kC3);
// everything else, or every call when !o.stepquant_fast, the
// one-CTA-per-head kernel. The fast and one-CTA-per-head kernels write the
// CPU backend's bytes; the tiled kernel the tile reference's (rounding
// differences from the CPU only).
int LaunchStepRecurrence(const StepKernelParams& p, const LaunchOptions& o, void* stream);
// Whether `p` is a decode step the fast kernels take (with o.stepquant_fast).
bool StepFastDecodeEligible(const StepKernelParams& p);
// The fast decode kernel of variant v for an eligible `p` (kTile: the tiled
// kernel when StepTileDecodeEligible, else kH2's build).
int LaunchStepFastDecode(const StepKernelParams& p, StepQuantVariant v, void* stream);
// The tiled decode kernel (StepTileDecodeKernel, stepquant_tile_kernel.cu:
// damp's thread map and TokenStep; bytes equal the tile reference - StepDecodeHead
// with the decay folded in, decode_math.h's ReferenceHeadStep, StepEncodeHead
// with StepSumOrder::kTile - and differ from the CPU backend's in rounding
// only). The default for eligible decode steps; LaunchOptions::
// stepquant_variant kH2 / kC2 / kC3 selects a build of the CPU-order fast
// kernel instead (A/B).
bool StepTileDecodeEligible(const StepKernelParams& p);
int LaunchStepTileDecode(const StepKernelParams& p, void* stream);
// Dynamic shared memory of one tiled-kernel CTA (bytes).
int TileSharedBytes();
int LaunchStepPack(const StepKernelParams& p, void* stream);
int LaunchStepUnpack(const StepKernelParams& p, void* stream);

}  // namespace cuda_internal
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_INTERNAL_STEPQUANT_PARAMS_H_
