// statecachectl calibrate | evaluate: the calibration commands of issue 3
// (client/ctl_calibration), dispatched with their own flags; and
// calibration of a model the server runs (calibrate --model).
//
//   statecachectl calibrate --trajectories=DIR --format=damp:16 --out=layout.safetensors
//   statecachectl --server=ADDR calibrate --model=qwen --trajectories=DIR --out=qwen.layout
//   statecachectl evaluate --synthetic
//
// "From a running model": --model names a model registered on the server;
// its geometry (and, unless --format is given, its DAMP format) come from
// DescribeModel, and the trajectories - FP32 states recorded from that model
// by the worker (record_trajectories, or any writer of
// kernels/trajectory/TRAJECTORY_FORMAT.md) - are streamed to the server's
// Calibrate RPC, which computes the layout. The layout file is written to
// --out; with --register_as the server also registers the calibrated layout
// under that new id (workers move to it; the running model is left as is).
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl/ctl_json.h"
#include "client/ctl_calibration/calibration_commands.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

constexpr char kRemoteHelp[] = R"(
calibrating a model the server runs (through the Calibrate RPC):
  --model=ID               registered model: geometry and format are taken from it
  --trajectories=PATHS     trajectory files / directories recorded from that model
  --format=damp:K          default: the model's format when it is damp / damp-sr
  --selector=NAME          as above; default: the format's
  --sample_every=N, --horizon=N   as above (0 = the server's defaults 8 and 256)
  --out=PATH               write the layout file
  --register_as=ID         also register the calibrated layout as model ID
  --slots=N, --checkpoints=N      its slots / checkpoints (0 = remaining budget)
  --json                   the CalibrateResponse as JSON (proto field names) on stdout
)";

int ToArgv(int (*main)(int, char**), const std::string& name,
           const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {name};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(&a[0]);
  return main(static_cast<int>(argv.size()), argv.data());
}

// `run` for callers that hold a CtlContext (tests): same as `main`.
std::function<absl::Status(CtlContext&, const std::vector<std::string>&)> RunVia(
    const std::function<int(CtlContext&, const std::vector<std::string>&)>& main,
    const std::string& name) {
  return [name, main](CtlContext& ctx, const std::vector<std::string>& args) -> absl::Status {
    const int rc = main(ctx, args);
    if (rc == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(name, " exited with code ", rc, " (its message is above)"));
  };
}

absl::Status CalibrateRemote(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.value_flags = {"model", "trajectories", "format", "selector", "sample_every", "horizon",
                      "out", "register_as", "slots", "checkpoints"};
  spec.bool_flags = {"json", "no_progress"};
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  const std::string model = f.Get("model", "");
  if (model.empty()) return absl::InvalidArgumentError("--model: empty");
  if (!f.Has("trajectories")) {
    return absl::InvalidArgumentError("calibrate --model: --trajectories=PATHS is required");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandTrajectoryPaths(f.Get("trajectories", "")));
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  ASSIGN_OR_RETURN(v1::ModelInfo info, client->DescribeModel(model));
  v1::CalibrateSettings settings;
  *settings.mutable_geometry() = info.geometry();
  settings.set_format(f.Get("format", info.format()));
  if (!f.Has("format") && !absl::StartsWith(info.format(), "damp")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format: model ", model, " is served as ", info.format(),
        ", which has no calibrated layout; give --format=damp:K or damp-sr:K"));
  }
  settings.set_selector(f.Get("selector", ""));
  ASSIGN_OR_RETURN(int sample_every, f.GetInt("sample_every", 0));
  ASSIGN_OR_RETURN(int horizon, f.GetInt("horizon", 0));
  ASSIGN_OR_RETURN(int slots, f.GetInt("slots", 0));
  ASSIGN_OR_RETURN(int checkpoints, f.GetInt("checkpoints", 0));
  settings.set_sample_every(sample_every);
  settings.set_horizon(horizon);
  settings.set_model_id(f.Get("register_as", ""));
  settings.set_slots(slots);
  settings.set_checkpoints(checkpoints);
  std::vector<CalibrationTrajectory> trajectories;
  for (const std::string& p : paths) {
    ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(p, "--trajectories"));
    trajectories.push_back({std::move(bytes), ""});
  }
  ASSIGN_OR_RETURN(v1::CalibrateResponse resp, client->Calibrate(settings, trajectories));
  if (f.Has("out")) RETURN_IF_ERROR(WriteFileBytes(f.Get("out", ""), resp.layout_file(), "--out"));
  std::FILE* out = ctx.out();
  if (f.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("command").String("calibrate").Key("model").String(model);
    w.Key("out").String(f.Get("out", "")).Key("response").Message(resp).EndObject();
    absl::FPrintF(out, "%s\n", w.str());
    return absl::OkStatus();
  }
  absl::FPrintF(out,
                "calibrated %s for model %s on %d trajectories (%d tokens/layer, %d samples "
                "per head): selector %s, fingerprint %016x\n",
                settings.format(), model, paths.size(), resp.tokens(), resp.samples(),
                resp.selector(), resp.layout_fingerprint());
  absl::FPrintF(out, "  %-24s %12s %12s\n", "domain", "trajectories", "samples");
  for (const v1::CalibrationDomain& d : resp.domains()) {
    absl::FPrintF(out, "  %-24s %12d %12d\n", d.domain(), d.trajectories(), d.samples());
  }
  if (f.Has("out")) absl::FPrintF(out, "layout file written to %s\n", f.Get("out", ""));
  if (resp.has_model()) PrintModels(out, {resp.model()});
  return absl::OkStatus();
}

bool WantsRemote(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--") break;
    if (a == "--model" || absl::StartsWith(a, "--model=")) return true;
  }
  return false;
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--") break;
    if (a == "--help" || a == "-h" || a == "--help=true") return true;
  }
  return false;
}

int CalibrateMain(CtlContext& ctx, const std::vector<std::string>& args) {
  if (WantsHelp(args)) {
    const int rc = ToArgv(&RunCalibrateCommand, "calibrate", {"--help"});
    absl::FPrintF(stdout, "%s", kRemoteHelp);
    return rc;
  }
  if (!WantsRemote(args)) return ToArgv(&RunCalibrateCommand, "calibrate", args);
  const absl::Status s = CalibrateRemote(ctx, args);
  if (!s.ok()) std::fprintf(stderr, "statecachectl calibrate: %s\n", s.ToString().c_str());
  return ExitCode(s);
}

int EvaluateMain(CtlContext&, const std::vector<std::string>& args) {
  return ToArgv(&RunEvaluateCommand, "evaluate", args);
}

}  // namespace

Command CalibrateCommand() {
  Command c{"calibrate", "trajectories -> calibrated DAMP / DAMP-SR layout file (issue 3)",
            "calibrate --trajectories=PATHS|--synthetic=SPEC --format=damp:16 --out=FILE | "
            "calibrate --model=ID --trajectories=PATHS [--out=FILE] [--register_as=ID]",
            RunVia(&CalibrateMain, "calibrate")};
  c.own_flags = true;
  c.main = &CalibrateMain;
  return c;
}

Command EvaluateCommand() {
  Command c{"evaluate", "held-out state/output error of every format, selector and layout",
            "evaluate --trajectories=PATHS|--synthetic=SPEC [--heldout=PATHS]",
            RunVia(&EvaluateMain, "evaluate")};
  c.own_flags = true;
  c.main = &EvaluateMain;
  return c;
}

}  // namespace statecache
