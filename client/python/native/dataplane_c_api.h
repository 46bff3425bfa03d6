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

/* Detaches (best effort), closes the session and frees `a` (NULL: no-op;
 * also frees a local pool). */
void sc_close(ScAttached* a);

/* ---- Local pools (client/cpp/local_pool.h) ------------------------------
 * The engine ops below on memory the caller owns (an engine's cache
 * tensor), with no server: `geometry` = {arch (0 GDN, 1 KDA), layers, h_qk,
 * h_v, d_k, d_v}, `scale` the readout scale (0: 1/sqrt(d_k)), `format` a
 * format spec ("damp:16", "fp32", ...), `layout_path` a layout file or NULL /
 * "" for the identity layout, `layout_layer` -1 or, for a one-layer pool,
 * the layer of a many-layer file it takes (LocalPoolOptions::layout_layer). sc_local_slot_bytes gives one slot's bytes (to
 * size the memory); sc_local_pool makes a handle over `bytes` at `base`
 * (backend "cpu", "cuda" or "auto"; host memory on the CPU, device memory on
 * CUDA; 16-byte aligned), slot s at base + s * slot_stride (0: slot_bytes;
 * else a multiple of 16, at least slot_bytes: the state inside bigger
 * per-sequence records), as many slots as fit, indexed by the caller. The handle serves the engine ops, sc_pool_slots, sc_record_* and
 * sc_attached_geometry; the attached-mode calls (sc_slot_indices,
 * sc_decode_update, sc_detach) return FAILED_PRECONDITION; sc_renew is a
 * no-op. Free it with sc_close (the memory stays the caller's). */
int sc_local_slot_bytes(const int32_t* geometry, float scale, const char* format,
                        const char* layout_path, int layout_layer, int64_t* slot_bytes,
                        char* err, int err_len);
int sc_local_pool(const char* backend, const int32_t* geometry, float scale, const char* format,
                  const char* layout_path, int layout_layer, void* base, int64_t bytes,
                  int64_t slot_stride, ScAttached** out, char* err, int err_len);

/* ---- Engine ops (issue 25; kernels/backend/stream_ops.h) ----------------
 * Stream-ordered calls on the mapped pool: slot indices are int32 pool
 * indices in backend memory (sc_slot_indices; -1 = padding), every call is
 * enqueued on `stream` (cudaStream_t; ignored on the CPU) with no host wait,
 * no allocation and no host-to-device copy, so a CUDA graph can capture it.
 * Host mistakes (null pointers, a detached session, a layer out of range, a
 * record too small) return an error at once and enqueue nothing; bad data
 * (slot indices, non-finite inputs, g > 0, beta outside [0, 2]) fails the
 * call on the device, writes nothing and lands in the caller's `record`
 * (sc_record_bytes() bytes of backend memory, 16-byte aligned, one stream at
 * a time), which sc_record_check reads. */

/* Pool indices of attached slot handles (FAILED_PRECONDITION naming slots[i]
 * for one not attached by this session). */
int sc_slot_indices(const ScAttached* a, const uint64_t* slot_ids,
                    const uint32_t* slot_generations, int n, int32_t* out, char* err,
                    int err_len);
/* Pool size (slots) and the record bytes a pool of that size needs. */
int64_t sc_pool_slots(const ScAttached* a);
int64_t sc_record_bytes(const ScAttached* a);
/* Writes an empty record on `stream`. */
int sc_record_init(ScAttached* a, void* record, int64_t record_bytes, uintptr_t stream,
                   char* err, int err_len);
/* Waits for `stream`, then 0, or the first failed call since the last reset
 * (3 = INVALID_ARGUMENT naming op, layer and field; 9 = FAILED_PRECONDITION
 * for a fenced pool); reset != 0 empties the record. */
int sc_record_check(ScAttached* a, void* record, int64_t record_bytes, uintptr_t stream,
                    int reset, char* err, int err_len);
/* Renews the lease now (an RPC); sc_renew_in_background starts a thread that
 * renews at half the lease until detach. */
int sc_renew(ScAttached* a, char* err, int err_len);
void sc_renew_in_background(ScAttached* a);

/* Decode (tokens = 1, o required) or prefill (tokens >= 1, o may be NULL):
 * q, k [n, tokens, h_qk, d_k], v [n, tokens, h_v, d_v] of `dtype`; g FP32
 * [n, tokens, h_v] (GDN) or [n, tokens, h_v, d_k] (KDA); beta FP32
 * [n, tokens, h_v]; o FP32 [n, tokens, h_v, d_v]. */
int sc_op_decode(ScAttached* a, int layer, const int32_t* slots, int n, int dtype, const void* q,
                 const void* k, const void* v, const float* g, const float* beta, float* o,
                 void* record, int64_t record_bytes, uintptr_t stream, char* err, int err_len);
int sc_op_prefill(ScAttached* a, int layer, const int32_t* slots, int n, int tokens, int dtype,
                  const void* q, const void* k, const void* v, const float* g, const float* beta,
                  float* o, void* record, int64_t record_bytes, uintptr_t stream, char* err,
                  int err_len);
/* FP32 states [n, layers, h_v, d_k, d_v] (natural order) into / out of slots. */
int sc_op_pack(ScAttached* a, const int32_t* slots, int n, const float* states, void* record,
               int64_t record_bytes, uintptr_t stream, char* err, int err_len);
int sc_op_unpack(ScAttached* a, const int32_t* slots, int n, float* states, void* record,
                 int64_t record_bytes, uintptr_t stream, char* err, int err_len);
/* pool slot dst[i] <- pool slot src[i] (pairs with -1 skipped; sources may
 * repeat, destinations may not and may not be sources). */
int sc_op_copy(ScAttached* a, const int32_t* src_slots, const int32_t* dst_slots, int n,
               void* record, int64_t record_bytes, uintptr_t stream, char* err, int err_len);

#ifdef __cplusplus
}
#endif

#endif /* STATECACHE_CLIENT_PYTHON_NATIVE_DATAPLANE_C_API_H_ */
