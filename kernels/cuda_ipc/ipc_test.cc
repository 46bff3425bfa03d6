// Two-process CUDA IPC: the parent exports a buffer and an event, a child
// process (this binary, re-executed with --gtest_filter=IpcChild.*) opens
// them, waits on the event, doubles the values and records its own event.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "kernels/cuda_ipc/ipc_runtime.h"

extern char** environ;

namespace statecache {
namespace cuda_ipc {
namespace {

constexpr int kN = 1 << 16;

TEST(IpcChild, DoublesExportedBuffer) {
  const char* mem = std::getenv("SC_IPC_MEM");
  const char* ev = std::getenv("SC_IPC_EVENT");
  if (mem == nullptr || ev == nullptr) GTEST_SKIP() << "child half of CudaIpc.TwoProcesses";
  std::string mem_handle, ev_handle;
  ASSERT_TRUE(absl::WebSafeBase64Unescape(mem, &mem_handle));
  ASSERT_TRUE(absl::WebSafeBase64Unescape(ev, &ev_handle));
  void* p = nullptr;
  void* e = nullptr;
  ASSERT_EQ(OpenMemHandle(mem_handle, &p), 0);
  ASSERT_EQ(OpenEventHandle(ev_handle, &e), 0);
  ASSERT_EQ(EventSynchronize(e), 0);
  std::vector<float> host(kN);
  ASSERT_EQ(CopyDeviceToHost(host.data(), p, kN * 4), 0);
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(host[i], static_cast<float>(i)) << i;
    host[i] *= 2;
  }
  ASSERT_EQ(CopyHostToDevice(p, host.data(), kN * 4), 0);
  ASSERT_EQ(DeviceSynchronize(), 0);
  ASSERT_EQ(CloseMemHandle(p), 0);
}

TEST(CudaIpc, TwoProcesses) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  void* p = nullptr;
  ASSERT_EQ(Malloc(&p, kN * 4), 0);
  std::vector<float> host(kN);
  for (int i = 0; i < kN; ++i) host[i] = static_cast<float>(i);
  ASSERT_EQ(CopyHostToDevice(p, host.data(), kN * 4), 0);
  std::string mem_handle, ev_handle;
  ASSERT_EQ(GetMemHandle(p, &mem_handle), 0);
  ASSERT_EQ(mem_handle.size(), static_cast<size_t>(kHandleBytes));
  void* e = nullptr;
  ASSERT_EQ(EventCreateInterprocess(&e), 0);
  ASSERT_EQ(GetEventHandle(e, &ev_handle), 0);
  ASSERT_EQ(EventRecord(e, nullptr), 0);

  const std::string env_mem = "SC_IPC_MEM=" + absl::WebSafeBase64Escape(mem_handle);
  const std::string env_ev = "SC_IPC_EVENT=" + absl::WebSafeBase64Escape(ev_handle);
  std::vector<std::string> env_strings = {env_mem, env_ev};
  for (char** v = environ; *v != nullptr; ++v) env_strings.push_back(*v);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=IpcChild.*";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0);
  ASSERT_EQ(CopyDeviceToHost(host.data(), p, kN * 4), 0);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(host[i], 2.f * i) << i;
  EXPECT_EQ(EventDestroy(e), 0);
  EXPECT_EQ(Free(p), 0);
}

}  // namespace
}  // namespace cuda_ipc
}  // namespace statecache
