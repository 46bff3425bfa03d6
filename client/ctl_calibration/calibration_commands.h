// `statecachectl calibrate` and `statecachectl evaluate` (issue 3), as
// functions the statecachectl binary dispatches to; calibrate_main is a
// standalone binary running either.
//
//   calibrate: trajectories -> DAMP / DAMP-SR layout file (+ timing and the
//              split-half stability report next to seed 000 table 5)
//   evaluate:  calibrate in memory, then replay held-out trajectories under
//              every format, selector and K_hi (and any --layout files) and
//              print state / output RRMSE and bits per value
//
// argv[0] is the subcommand name; `--help` prints the flags. Tables go to
// stdout; --json=PATH writes the machine-readable report ("-" = stdout,
// replacing the tables). Progress bars go to stderr, only on a TTY.
// Returns a process exit code: 0 ok, 1 error (message on stderr), 2 usage.
#ifndef STATECACHE_CLIENT_CTL_CALIBRATION_CALIBRATION_COMMANDS_H_
#define STATECACHE_CLIENT_CTL_CALIBRATION_CALIBRATION_COMMANDS_H_

namespace statecache {

int RunCalibrateCommand(int argc, char** argv);
int RunEvaluateCommand(int argc, char** argv);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_CTL_CALIBRATION_CALIBRATION_COMMANDS_H_
