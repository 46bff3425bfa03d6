/* C ABI of attached mode (issue 10) for the Python binding
 * (statecache/attached.py, ctypes) and other non-C++ workers:
 * libstatecache_dataplane.so wraps DataPlaneSession + AttachedSession
 * (client/cpp/dataplane_client.h).
 *
 * Every function that can fail returns 0 or an absl::StatusCode value
 * (3 = INVALID_ARGUMENT, 5 = NOT_FOUND, 9 = FAILED_PRECONDITION, ...) and
 * writes the message (NUL-terminated, truncated to err_len) into err.
 * Pointers are raw addresses in the server backend's memory: host memory on
 * the CPU backend (numpy .ctypes.data, torch CPU .data_ptr()), device memory
 * on CUDA (torch CUDA .data_ptr()); tensors are dense and row-major.
 * One handle is used by one thread at a time.
 *
 *   ScAttached* a;
 *   sc_attach("unix:/run/sc.sock", "", "qwen", ids, gens, 4, 0, &a, err, 256);
 *   sc_decode_update(a, layer, ids, gens, 4, SC_DTYPE_FP32, q, k, v, g, beta, o,
 *                    stream, err, 256);
 *   sc_close(a);
 */
#ifndef STATECACHE_CLIENT_PYTHON_NATIVE_DATAPLANE_C_API_H_
#define STATECACHE_CLIENT_PYTHON_NATIVE_DATAPLANE_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SC_DTYPE_FP32 0
#define SC_DTYPE_BF16 1
#define SC_DTYPE_FP16 2

typedef struct ScAttached ScAttached;

/* Connects to `target` (host:port or unix:PATH; bearer_token may be NULL or
 * ""), opens a data-plane session (lease_ms 0 = server default), attaches
 * the n_slots slots (ids, generations) of model_id and maps its arena. */
int sc_attach(const char* target, const char* bearer_token, const char* model_id,
              const uint64_t* slot_ids, const uint32_t* slot_generations, int n_slots,
              int64_t lease_ms, ScAttached** out, char* err, int err_len);

/* geometry[7] = {arch (0 gdn, 1 kda), layers, h_qk, h_v, d_k, d_v, cuda (0/1)};
 * scale = the model's readout scale. */
void sc_attached_geometry(const ScAttached* a, int32_t* geometry, float* scale);

/* One fused decode step of `layer` for n slots (attached ones; the first
 * call with a new slot list stages it, repeats are cheap). q, k: [n, h_qk,
 * d_k]; v: [n, h_v, d_v] (dtype of all three); g: FP32 [n, h_v] (GDN) or
 * [n, h_v, d_k] (KDA); beta: FP32 [n, h_v]; o: FP32 [n, h_v, d_v], written.
 * CUDA: the kernel is ordered after the work enqueued so far on `stream`
 * (a cudaStream_t value, 0 = legacy default stream); o is complete on
 * return. CPU: `stream` is ignored. */
int sc_decode_update(ScAttached* a, int layer, const uint64_t* slot_ids,
                     const uint32_t* slot_generations, int n, int dtype, const void* q,
                     const void* k, const void* v, const float* g, const float* beta, float* o,
                     uintptr_t stream, char* err, int err_len);

/* Ends the attachment (the slots go back to server-side use); later
 * sc_decode_update calls fail with FAILED_PRECONDITION. */
int sc_detach(ScAttached* a, char* err, int err_len);

/* Detaches (best effort), closes the session and frees `a` (NULL: no-op). */
void sc_close(ScAttached* a);

#ifdef __cplusplus
}
#endif

#endif /* STATECACHE_CLIENT_PYTHON_NATIVE_DATAPLANE_C_API_H_ */
