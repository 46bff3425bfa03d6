// statecachectl status: health, backend, budgets and per-model use.
#include "absl/strings/str_format.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl/ctl_json.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

double Ratio(int64_t a, int64_t b) { return b == 0 ? 0.0 : static_cast<double>(a) / b; }

absl::Status RunStatus(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.bool_flags = {"json"};
  ASSIGN_OR_RETURN(CliFlags flags, ParseCommandFlags(args, spec));
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  ASSIGN_OR_RETURN(bool serving, client->CheckHealth());
  ASSIGN_OR_RETURN(v1::GetStatsResponse stats, client->GetStats());
  std::FILE* out = ctx.out();
  if (flags.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("server").String(ctx.server()).Key("serving").Bool(serving);
    w.Key("stats").Message(stats).EndObject();
    absl::FPrintF(out, "%s\n", w.str());
    return absl::OkStatus();
  }
  absl::FPrintF(out, "server       %s (%s)\n", ctx.server(), serving ? "SERVING" : "NOT_SERVING");
  absl::FPrintF(out, "version      %s, up %.0f s\n", stats.version(), stats.uptime_seconds());
  absl::FPrintF(out, "backend      %s: %s\n", stats.backend(), stats.backend_description());
  absl::FPrintF(out, "state mem    %s reserved of %s\n",
                HumanBytes(stats.state_memory_reserved_bytes()),
                HumanBytes(stats.state_memory_budget_bytes()));
  absl::FPrintF(out, "ckpt mem     %s reserved of %s\n",
                HumanBytes(stats.checkpoint_memory_reserved_bytes()),
                HumanBytes(stats.checkpoint_memory_budget_bytes()));
  absl::FPrintF(out, "models       %d\n", stats.models_size());
  if (stats.models_size() == 0) return absl::OkStatus();
  absl::FPrintF(out, "\n%-20s %-12s %13s %12s %12s %9s %10s %9s\n", "model", "format", "slots",
                "state", "vs fp32", "ckpts", "hit rate", "evicted");
  for (const v1::ModelStatsEntry& e : stats.models()) {
    const v1::ModelStats& s = e.stats();
    const int64_t lookups = s.lookups_hit() + s.lookups_miss();
    absl::FPrintF(out, "%-20s %-12s %6d/%-6d %12s %11.1f%% %4d/%-4d %9s %9d\n", e.model_id(),
                  e.format(), s.slots_allocated(), s.slot_capacity(),
                  HumanBytes(s.state_used_bytes().total()),
                  100.0 * Ratio(s.state_used_bytes().total(), s.fp32_equivalent_bytes()),
                  s.checkpoints(), s.checkpoint_capacity(),
                  lookups == 0 ? std::string("-")
                               : absl::StrFormat("%.1f%%", 100.0 * Ratio(s.lookups_hit(), lookups)),
                  s.evictions());
  }
  return absl::OkStatus();
}

}  // namespace

Command StatusCommand() {
  Command c{"status", "server health, backend, memory budgets and per-model use",
            "status [--json]", RunStatus};
  c.help =
      "  --json   one JSON object: {server, serving, stats: GetStatsResponse with proto field\n"
      "           names (fixed64 as hex strings)}\n";
  return c;
}

}  // namespace statecache
