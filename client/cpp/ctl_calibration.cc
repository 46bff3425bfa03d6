// statecachectl calibrate | evaluate: the calibration commands of issue 3
// (client/ctl_calibration), dispatched with their own flags.
//
//   statecachectl calibrate --trajectories=DIR --format=damp:16 --out=layout.safetensors
//   statecachectl evaluate --synthetic
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/ctl_command.h"
#include "client/ctl_calibration/calibration_commands.h"

namespace statecache {
namespace {

// `run` for callers that hold a CtlContext (tests): same as `main`.
std::function<absl::Status(CtlContext&, const std::vector<std::string>&)> RunVia(
    const std::string& name, int (*main)(int, char**)) {
  return [name, main](CtlContext&, const std::vector<std::string>& args) -> absl::Status {
    std::vector<std::string> argv_s = {name};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(&a[0]);
    const int rc = main(static_cast<int>(argv.size()), argv.data());
    if (rc == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(name, " exited with code ", rc, " (its message is above)"));
  };
}

}  // namespace

Command CalibrateCommand() {
  Command c{"calibrate", "trajectories -> calibrated DAMP / DAMP-SR layout file (issue 3)",
            "calibrate --trajectories=PATHS|--synthetic=SPEC --format=damp:16 --out=FILE   "
            "(calibrate --help)",
            RunVia("calibrate", &RunCalibrateCommand)};
  c.own_flags = true;
  c.main = &RunCalibrateCommand;
  return c;
}

Command EvaluateCommand() {
  Command c{"evaluate", "held-out state/output error of every format, selector and layout",
            "evaluate --trajectories=PATHS|--synthetic=SPEC [--heldout=PATHS]   (evaluate --help)",
            RunVia("evaluate", &RunEvaluateCommand)};
  c.own_flags = true;
  c.main = &RunEvaluateCommand;
  return c;
}

}  // namespace statecache
