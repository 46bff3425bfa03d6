// statecachectl demo / serve-bench / calibrate end to end with small flags:
// a statecached child (CPU backend), the shipped gdn-tiny model, and checks
// on the printed report (exact counters where the workload fixes them).
#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "client/ctl/ctl_command.h"
#include "kernels/layout/layout_file.h"

namespace statecache {
namespace {

using ::testing::HasSubstr;

// Runs `command` with `args`, returning its status and stdout.
std::pair<absl::Status, std::string> RunCommand(const Command& command,
                                         const std::vector<std::string>& args) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buf, &size);
  CtlContext ctx("", absl::Seconds(5), out);
  absl::Status status = command.run(ctx, args);
  std::fclose(out);
  std::string text(buf, size);
  free(buf);
  return {status, text};
}

TEST(CtlDemoTest, DemoPrintsMemoryHitsLatencyAndAccuracy) {
  auto [status, text] =
      RunCommand(DemoCommand(), {"--conversations=2", "--turns=3", "--prompt_bytes=32",
                          "--reply_bytes=4", "--calibration_docs=1"});
  ASSERT_TRUE(status.ok()) << status << "\n" << text;
  EXPECT_THAT(text, HasSubstr("damp:16 calibrated on 3 documents"));
  EXPECT_THAT(text, HasSubstr("316.00 KiB in damp:16 (9.88 bits/value) vs 1.00 MiB in fp32: 3.24x smaller"));
  EXPECT_THAT(text, HasSubstr("turns 2+ resumed from a checkpoint  4 / 4 (100%)"));
  // Context before turns 2 and 3: 36 and 72 tokens, per conversation.
  EXPECT_THAT(text, HasSubstr("context tokens restored             216 of 216 (recomputed: 0)"));
  EXPECT_THAT(text, HasSubstr("lookups 4 hit / 2 miss, 6 snapshots, 4 restores, 0 evictions"));
  EXPECT_THAT(text, HasSubstr("over 96 updates"));  // 2 x 3 x 4 reply bytes x 4 layers
  EXPECT_THAT(text, HasSubstr("Accuracy against FP32 states (same bytes, 214 predicted, 24 of them"));
  EXPECT_THAT(text, HasSubstr("greedy agreement"));
}

TEST(CtlDemoTest, DemoRegistersALayoutFile) {
  // gdn-tiny geometry, a damp:16 layout with reversed key order per head.
  // (scale as config.json states it)
  const ModelGeometry g{Arch::kGdn, 4, 2, 4, 128, 128, static_cast<float>(0.08838834764831845)};
  std::vector<int32_t> perm;
  for (int h = 0; h < g.layers * g.h_v; ++h) {
    for (int r = g.d_k - 1; r >= 0; --r) perm.push_back(r);
  }
  auto layout = StateLayout::Create(g, *ParseFormatSpec("damp:16"), perm, {}, {});
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::string path = ::testing::TempDir() + "/reversed.layout.safetensors";
  ASSERT_TRUE(WriteLayoutFile(*layout, {{"selector", "reversed"}}, {}, path).ok());
  auto [status, text] = RunCommand(DemoCommand(), {"--conversations=1", "--turns=2", "--prompt_bytes=16",
                                            "--reply_bytes=2", "--layout=" + path});
  ASSERT_TRUE(status.ok()) << status << "\n" << text;
  EXPECT_THAT(text, HasSubstr("from layout file " + path + " (registered as a file)"));
  EXPECT_THAT(text, HasSubstr("turns 2+ resumed from a checkpoint  1 / 1 (100%)"));
  // A layout of another format is rejected before anything is served.
  auto [bad, bad_text] = RunCommand(DemoCommand(), {"--format=damp:32", "--layout=" + path});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
}

TEST(CtlDemoTest, DemoRejectsBadFlags) {
  EXPECT_EQ(RunCommand(DemoCommand(), {"--bogus=1"}).first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunCommand(DemoCommand(), {"--conversations=99"}).first.code(),
            absl::StatusCode::kInvalidArgument);
  auto [status, text] = RunCommand(DemoCommand(), {"--help"});
  EXPECT_TRUE(status.ok());
  EXPECT_THAT(text, HasSubstr("--conversations=N"));
  EXPECT_TRUE(DemoCommand().own_flags);
}

TEST(CtlDemoTest, ServeBenchComparesFormatsUnderOneBudget) {
  // 2 MiB: fp32 holds 2 checkpoints, damp:16 6; 3 conversations round robin
  // need 2 x 3 - 1 = 5 for every later turn to hit.
  auto [status, text] = RunCommand(ServeBenchCommand(),
                            {"--formats=fp32,damp:16", "--budget_mib=2", "--conversations=3",
                             "--turns=2", "--prompt_bytes=24", "--reply_bytes=4",
                             "--round_robin", "--repeats=1", "--calibration_docs=1", "--markdown"});
  ASSERT_TRUE(status.ok()) << status << "\n" << text;
  EXPECT_THAT(text, HasSubstr("| fp32 | 1.00 MiB | 2 | 0/3 (0%) | 0 | 84 |"));
  EXPECT_THAT(text, HasSubstr("| damp:16 | 316.00 KiB | 6 | 3/3 (100%) | 3 | 0 |"));
  EXPECT_THAT(text, HasSubstr("Time to first output by turn"));
  EXPECT_EQ(RunCommand(ServeBenchCommand(), {"--budget_mib=0"}).first.code(),
            absl::StatusCode::kInvalidArgument);
}

// The help texts as they were before serve-bench and demo parsed their flags
// with ParseCommandFlags: demo's is unchanged, serve-bench's only gained
// lines at the end; -h prints the same.
constexpr char kDemoHelpGolden[] =
    "statecachectl demo [flags]\n"
    "  Serves a multi-turn workload of the shipped GDN model through statecached with DAMP\n"
    "  states and compares it with FP32 states. Flags (defaults in brackets):\n"
    "  --server=ADDR          use a running statecached [start a child statecached]\n"
    "  --statecached=PATH     the child's binary [found next to statecachectl / in runfiles]\n"
    "  --backend=cpu|cuda|auto  the child's backend [cpu]\n"
    "  --model=NAME|DIR       model under <shared>/models or a folder [gdn-tiny]\n"
    "  --format=SPEC          state format of the served run [damp:16]\n"
    "  --layout=FILE          layout file (statecachectl calibrate --out) instead of calibrating\n"
    "  --calibration_docs=N   calibration documents per domain (of 8) [2]\n"
    "  --conversations=N      conversations, one per held-out document (<= 6) [4]\n"
    "  --turns=N              turns per conversation [4]\n"
    "  --prompt_bytes=N       new bytes per turn, prefilled [96]\n"
    "  --reply_bytes=N        reply bytes per turn, decoded one step at a time [16]\n"
    "  --threads=N            worker matmul threads, 0 = all cores [0]\n";
constexpr char kServeBenchHelpBefore[] =
    "statecachectl serve-bench [flags]\n"
    "  The demo's multi-turn workload (random interleaving of conversations) served once per\n"
    "  format under one checkpoint-memory budget: checkpoint hits, restores, recomputed\n"
    "  tokens, time to first output (TTFT) per turn, accuracy vs FP32. Flags [defaults]:\n"
    "  --formats=LIST         comma-separated format specs [fp32,bf16,damp:16]\n"
    "  --budget_mib=X         checkpoint memory per format, MiB [4]\n"
    "  --conversations=N      conversations, one per held-out document (<= 6) [6]\n"
    "  --turns=N              turns per conversation [4]\n"
    "  --prompt_bytes=N       new bytes per turn, prefilled [96]\n"
    "  --reply_bytes=N        reply bytes per turn, decoded one step at a time [16]\n"
    "  --seed=N               interleaving seed [1]; --round_robin for a fixed rotation\n"
    "  --calibration_docs=N   DAMP calibration documents per domain [2]\n"
    "  --repeats=N            serve the workload N times per format; TTFT = median [3]\n"
    "  --markdown             also print the tables as Markdown\n"
    "  --server, --statecached, --backend, --model, --threads   as for demo\n";

TEST(CtlDemoTest, HelpTextsAreKept) {
  auto [demo_status, demo] = RunCommand(DemoCommand(), {"--help"});
  ASSERT_TRUE(demo_status.ok());
  EXPECT_EQ(demo, kDemoHelpGolden);
  EXPECT_EQ(RunCommand(DemoCommand(), {"-h"}).second, demo);
  auto [sb_status, sb] = RunCommand(ServeBenchCommand(), {"--help"});
  ASSERT_TRUE(sb_status.ok());
  EXPECT_EQ(sb.substr(0, std::string(kServeBenchHelpBefore).size()), kServeBenchHelpBefore);
  EXPECT_EQ(RunCommand(ServeBenchCommand(), {"-h"}).second, sb);
  for (const char* flag : {"--budget_gib", "--setups", "--host_mib", "--redis=", "--redis_server",
                           "--servers", "--route", "--join_after", "--state_geometry"}) {
    EXPECT_THAT(sb, HasSubstr(flag));
  }
  // A global flag after the command name is not one of its own.
  auto [bad, text] = RunCommand(ServeBenchCommand(), {"--token_file=x"});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("global flag"));
}

TEST(CtlDemoTest, CalibrateAndEvaluateDispatchToTheCalibrationCommands) {
  const Command c = CalibrateCommand();
  EXPECT_TRUE(c.own_flags);
  ASSERT_TRUE(c.main != nullptr);
  auto [ok, help] = RunCommand(c, {"--help"});
  EXPECT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(RunCommand(c, {"--no-such-flag"}).first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RunCommand(EvaluateCommand(), {"--help"}).first.ok());
}

}  // namespace
}  // namespace statecache
