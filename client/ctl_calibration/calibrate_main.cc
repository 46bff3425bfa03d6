// Standalone driver of the calibration commands until statecachectl
// dispatches to them:
//   calibrate_main calibrate --help
//   calibrate_main evaluate --synthetic=arch=gdn,layers=4 --json=-
#include <cstdio>
#include <cstring>

#include "client/ctl_calibration/calibration_commands.h"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "calibrate") == 0) {
    return statecache::RunCalibrateCommand(argc - 1, argv + 1);
  }
  if (argc >= 2 && std::strcmp(argv[1], "evaluate") == 0) {
    return statecache::RunEvaluateCommand(argc - 1, argv + 1);
  }
  std::fprintf(stderr,
               "usage: %s calibrate|evaluate [flags]   (--help after the command for flags)\n",
               argv[0]);
  return 2;
}
