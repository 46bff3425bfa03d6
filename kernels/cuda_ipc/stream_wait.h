// Device-side waits of a worker's CUDA stream on a done word written by
// statecached (SubmitUpdates, issue 10): the worker's host never blocks; and
// the server's stream-ordered store of that word.
//
// Plain C++ (no CUDA types): streams are cudaStream_t as void* (nullptr = the
// legacy default stream); functions return a cudaError_t value as int
// (0 = success; cuda_ipc::ErrorString names it).
//
//   // o of submission `seq` is read by kernels enqueued on `stream` after:
//   RETURN_IF_ERROR(Check(StreamWaitGeq(stream, done_word, seq)));
#ifndef STATECACHE_KERNELS_CUDA_IPC_STREAM_WAIT_H_
#define STATECACHE_KERNELS_CUDA_IPC_STREAM_WAIT_H_

#include <cstdint>

namespace statecache {
namespace stream_wait {

// Enqueues on `stream` a wait until the 32-bit word at `device_word` (device
// memory, 4-aligned) satisfies (int32_t)(*word - value) >= 0 (cyclic, so the
// low 32 bits of a 64-bit counter work across wrap-around). Uses the driver's
// cuStreamWaitValue32 (no SM is occupied) when the driver offers it, else a
// one-thread polling kernel.
int StreamWaitGeq(void* stream, const void* device_word, uint32_t value);

// Enqueues on `stream` a one-thread kernel that raises the 8-byte word at
// `device_word` (device memory, 8-aligned) to `value` (atomicMax: the word
// never goes back): the server's done word, written after the submission's
// kernels on the same stream without a host wait.
int StreamStoreWord(void* stream, void* device_word, uint64_t value);

// The same on a private non-blocking stream, waited for on the host: a
// worker releasing its own streams' waits on a done word after the stream
// to the server ended (its legacy / current stream may be the blocked one).
int ReleaseWord(void* device_word, uint64_t value);

// Gates: the server's own device-side wait for a worker's ring event
// (SubmitUpdates on a DecodeQueue). Two 32-bit words in pinned, mapped host
// memory (words[0] = the gate, words[1] = the abort flag), written by a host
// thread that polls the worker's event: the queue's stream never waits on
// anything the server cannot release itself.
int AllocGateWords(uint32_t** words);
int FreeGateWords(uint32_t* words);
// Enqueues on `stream` a one-thread kernel that waits until
// (int32_t)(words[0] - value) >= 0, then, when words[1] != 0, stores a NaN
// float into `abort_word` (device memory: a DecodeQueue's abort word, which
// makes the update write nothing).
int StreamGate(void* stream, const uint32_t* words, uint32_t value, void* abort_word);
// cudaEventQuery: 0 when the event's work completed, cudaErrorNotReady
// (600) while it has not, another error code otherwise.
int EventQuery(void* event);

// A new non-blocking stream (*stream) of the current device, for a worker
// thread that must not share the legacy default stream with other threads;
// DestroyWorkerStream waits for its work first.
int CreateWorkerStream(void** stream);
int DestroyWorkerStream(void* stream);

// "cuStreamWaitValue32", "polling kernel" or "none" (no usable device):
// which mechanism StreamWaitGeq uses in this process.
const char* Mechanism();

}  // namespace stream_wait
}  // namespace statecache

#endif  // STATECACHE_KERNELS_CUDA_IPC_STREAM_WAIT_H_
