// statecachectl demo: the README's main job (issue 6).
//
// Starts a statecached child (or uses --server), registers the shipped GDN
// model with a calibrated DAMP layout, serves a multi-turn workload through
// the reference model worker on the remote store (every turn restores the
// previous turn's checkpoint and prefills only its new bytes), runs the same
// workload with FP32 states in process, and prints state memory vs FP32, the
// prefix hit rate, update latency and accuracy against FP32.
//
//   statecachectl demo                       # child statecached, CPU backend
//   statecachectl demo --server=host:50051   # a running statecached
//   statecachectl demo --conversations=6 --turns=8 --format=damp:32
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl_calibration/cli_flags.h"
#include "client/remote_store/demo_support.h"
#include "client/remote_store/multi_turn.h"
#include "kernels/common/status_macros.h"
#include "kernels/formats/format.h"
#include "kernels/layout/layout_file.h"

namespace statecache {
namespace {

constexpr char kDemoHelp[] =
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

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The layout the demo registers: from --layout (sent as a file, in
// reg->layout_file), calibrated for a mixed format, else the identity.
// *info says which, for the header.
absl::Status ChooseLayout(const CliFlags& f, const DemoData& data, const ModelGeometry& geo,
                          const FormatSpec& format, int calibration_docs, Registration* reg,
                          std::optional<StateLayout>* layout, std::string* info) {
  if (f.Has("layout")) {
    // Checked here, and sent as a file: the server checks it again.
    const std::string path = f.Get("layout", "");
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("--layout: cannot read ", path));
    std::stringstream bytes;
    bytes << in.rdbuf();
    reg->layout_file = bytes.str();
    ASSIGN_OR_RETURN(LayoutFile lf, ParseLayout(reg->layout_file, &geo, &format));
    *layout = std::move(lf.layout);
    *info = absl::StrCat("from layout file ", path, " (registered as a file)");
  } else if (IsMixedFormat(format.format)) {
    ASSIGN_OR_RETURN(*layout, CalibrateLayout(*data.model, data.calibration, calibration_docs,
                                              format, info));
    *info = absl::StrCat("calibrated on ", *info);
  } else {
    ASSIGN_OR_RETURN(*layout, StateLayout::Identity(geo, format));
    *info = "identity (this format has no calibrated maps)";
  }
  return absl::OkStatus();
}

// "State memory": one sequence's packed bytes vs FP32, the checkpoints held.
void PrintStateMemory(std::FILE* out, const v1::ModelInfo& info, const v1::ModelStats& ms) {
  absl::FPrintF(out, "State memory\n");
  absl::FPrintF(out, "  one sequence       %s in %s (%.2f bits/value) vs %s in fp32: %.2fx smaller\n",
                Bytes(info.slot_bytes()), info.format(), info.payload_bits_per_value(),
                Bytes(info.fp32_slot_bytes()),
                static_cast<double>(info.fp32_slot_bytes()) / info.slot_bytes());
  absl::FPrintF(out, "  checkpoints held   %d = %s (in fp32: %s); plus %s of conv windows (aux bytes)\n",
                ms.checkpoints(), Bytes(ms.checkpoint_used_bytes().total()),
                Bytes(static_cast<double>(ms.checkpoints()) * info.fp32_slot_bytes()),
                Bytes(ms.checkpoint_aux_bytes()));
}

// "Prefix cache": turns resumed from a checkpoint, tokens restored and
// prefilled, time to first output, the server's cache counters.
void PrintPrefixCache(std::FILE* out, const WorkloadResult& run, const v1::ModelStats& ms,
                      int prompt_bytes) {
  int later = 0, later_hit = 0;
  int64_t context = 0, restored = 0, prefilled = 0, recomputed = 0;
  std::vector<double> ttft_first, ttft_later;
  for (const TurnStats& ts : run.turns) {
    prefilled += ts.prefilled_tokens;
    recomputed += ts.recomputed_tokens;
    if (ts.turn == 0) {
      ttft_first.push_back(ts.ttft_ms);
      continue;
    }
    ++later;
    later_hit += ts.restored_tokens > 0;
    context += ts.context_tokens;
    restored += ts.restored_tokens;
    ttft_later.push_back(ts.ttft_ms);
  }
  absl::FPrintF(out, "Prefix cache (LookupPrefix + Restore at the start of every turn)\n");
  absl::FPrintF(out, "  turns 2+ resumed from a checkpoint  %d / %d (%.0f%%)\n", later_hit, later,
                later > 0 ? 100.0 * later_hit / later : 0.0);
  absl::FPrintF(out, "  context tokens restored             %s of %s (recomputed: %s)\n",
                Thousands(restored), Thousands(context), Thousands(recomputed));
  absl::FPrintF(out, "  tokens prefilled                    %s (without the cache: %s)\n",
                Thousands(prefilled), Thousands(prefilled + restored));
  absl::FPrintF(out,
                "  time to first output, p50           first turns %.1f ms; turns 2+ %.1f ms "
                "(restore + %d new bytes)\n",
                Percentile(ttft_first, 50), Percentile(ttft_later, 50), prompt_bytes);
  absl::FPrintF(out, "  server counters                     lookups %d hit / %d miss, %d snapshots, "
                "%d restores, %d evictions\n",
                ms.lookups_hit(), ms.lookups_miss(), ms.snapshots(), ms.restores(),
                ms.evictions());
}

// "Update latency" (UpdateStream round trips) and "Accuracy" against FP32.
void PrintLatencyAndAccuracy(std::FILE* out, const WorkloadResult& run, const Accuracy& acc,
                             const v1::ModelInfo& info, bool child) {
  absl::FPrintF(out, "Update latency (UpdateStream round trip: one layer of one token; dequantize, "
                "update, read out, requantize)\n");
  absl::FPrintF(out, "  p50 %.0f us   p99 %.0f us   over %s updates (%s)\n",
                Percentile(run.update_micros, 50), Percentile(run.update_micros, 99),
                Thousands(run.update_micros.size()), child ? "local unix socket" : "network");

  absl::FPrintF(out, "Accuracy against FP32 states (same bytes, %s predicted, %s of them reply bytes)\n",
                Thousands(acc.predicted), Thousands(acc.reply_predicted));
  absl::FPrintF(out, "  bits/byte          %s %.4f   fp32 %.4f   (%+.4f)\n", info.format(),
                acc.bits_per_byte, acc.reference_bits_per_byte,
                // (no "-0.0000" for a difference that rounds to zero)
                std::abs(acc.bits_per_byte - acc.reference_bits_per_byte) < 5e-5
                    ? 0.0
                    : acc.bits_per_byte - acc.reference_bits_per_byte);
  absl::FPrintF(out, "  greedy agreement   %.2f%% of positions (reply bytes: %.2f%%)\n",
                100 * acc.agreement, 100 * acc.reply_agreement);
}

absl::Status RunDemo(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.value_flags = {"server",        "statecached", "backend", "model",
                      "format",        "layout",      "calibration_docs",
                      "conversations", "turns",       "prompt_bytes",
                      "reply_bytes",   "threads"};
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  std::FILE* out = ctx.out();
  if (f.Has("help")) {
    absl::FPrintF(out, "%s", kDemoHelp);
    return absl::OkStatus();
  }
  WorkloadOptions wo;
  ASSIGN_OR_RETURN(wo.conversations, f.GetInt("conversations", 4));
  ASSIGN_OR_RETURN(wo.turns, f.GetInt("turns", 4));
  ASSIGN_OR_RETURN(wo.prompt_bytes, f.GetInt("prompt_bytes", 96));
  ASSIGN_OR_RETURN(wo.reply_bytes, f.GetInt("reply_bytes", 16));
  ASSIGN_OR_RETURN(const int calibration_docs, f.GetInt("calibration_docs", 2));
  ASSIGN_OR_RETURN(const int threads, f.GetInt("threads", 0));
  ASSIGN_OR_RETURN(const FormatSpec format, ParseFormatSpec(f.Get("format", "damp:16")));
  const auto t0 = std::chrono::steady_clock::now();

  ASSIGN_OR_RETURN(DemoData data, LoadDemoData(f.Get("model", "gdn-tiny"), threads));
  const LanguageModel& model = *data.model;
  const ModelGeometry geo = model.config().Geometry();
  ASSIGN_OR_RETURN(std::vector<Conversation> convs, MakeConversations(data.heldout, wo));
  const auto schedule = MakeSchedule(convs, wo);

  ServerSetup setup;
  setup.server = f.Get("server", ctx.server());
  setup.statecached = f.Get("statecached", "");
  setup.backend = f.Get("backend", "cpu");
  ASSIGN_OR_RETURN(ServerHandle server, StartOrConnect(setup));

  absl::FPrintF(out, "statecache demo: a multi-turn chat workload served by statecached with %s states\n\n",
                FormatSpecName(format));
  absl::FPrintF(out, "  model     %s: %s, %d layers x %d value heads, %d x %d state per head (%s values per sequence)\n",
                data.model_name, geo.arch == Arch::kKda ? "KDA" : "GDN", geo.layers, geo.h_v,
                geo.d_k, geo.d_v, Thousands(StateElements(geo)));
  absl::FPrintF(out, "  server    %s\n", server.description);

  std::string layout_info;
  std::optional<StateLayout> layout;
  Registration reg;
  reg.slots = 2;
  RETURN_IF_ERROR(
      ChooseLayout(f, data, geo, format, calibration_docs, &reg, &layout, &layout_info));
  absl::FPrintF(out, "  layout    %s %s\n", FormatSpecName(format), layout_info);
  absl::FPrintF(out,
                "  workload  %d conversations x %d turns from heldout.jsonl; turn k = turns 1..k-1 + "
                "%d new bytes (prefilled)\n"
                "            + %d reply bytes (decoded one byte per step, teacher-forced so every "
                "run sees the same bytes)\n\n",
                wo.conversations, wo.turns, wo.prompt_bytes, wo.reply_bytes);

  ASSIGN_OR_RETURN(v1::ModelInfo info,
                   RegisterLayout(server.client.get(), absl::StrCat(data.model_name, "-demo"),
                                  *layout, reg));
  const std::string model_id = info.model_id();

  auto t = std::chrono::steady_clock::now();
  absl::FPrintF(out, "Serving the workload through statecached (model %s, %s) ...", model_id,
                info.format());
  std::fflush(out);
  RemoteStateStore::Options so;
  so.layout = *layout;
  ASSIGN_OR_RETURN(WorkloadResult run, RunRemoteWorkload(model, server.client.get(), model_id,
                                                         convs, schedule, so));
  absl::FPrintF(out, " %.1f s\n", SecondsSince(t));
  t = std::chrono::steady_clock::now();
  absl::FPrintF(out, "Running the same workload with FP32 states in process (the reference) ...");
  std::fflush(out);
  ASSIGN_OR_RETURN(WorkloadResult ref, RunFp32Reference(model, convs, schedule));
  absl::FPrintF(out, " %.1f s\n\n", SecondsSince(t));
  ASSIGN_OR_RETURN(Accuracy acc, CompareRuns(run, ref));
  ASSIGN_OR_RETURN(v1::GetStatsResponse stats, server.client->GetStats(model_id));
  const v1::ModelStats& ms = stats.models(0).stats();

  PrintStateMemory(out, info, ms);
  PrintPrefixCache(out, run, ms, wo.prompt_bytes);
  PrintLatencyAndAccuracy(out, run, acc, info, server.child != nullptr);
  std::string dropped;
  if (!server.child) {  // leave a shared server as it was
    RETURN_IF_ERROR(server.client->DropModel(model_id, /*force=*/true));
    dropped = absl::StrCat(" (model ", model_id, " dropped from the server again)");
  }
  absl::FPrintF(out, "\nTotal %.1f s%s.\n", SecondsSince(t0), dropped);
  return absl::OkStatus();
}

}  // namespace

Command DemoCommand() {
  Command c{"demo",
            "multi-turn workload of the shipped GDN model with DAMP states vs FP32 "
            "(memory, prefix hits, latency, accuracy)",
            "demo [--server=ADDR] [--conversations=4 --turns=4 ...]   (demo --help for all flags)",
            RunDemo};
  c.own_flags = true;
  return c;
}

}  // namespace statecache
