// statecachectl models: the registered models.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl/ctl_json.h"
#include "kernels/common/status_macros.h"

namespace statecache {

void PrintModels(std::FILE* out, const std::vector<v1::ModelInfo>& models) {
  if (models.empty()) {
    absl::FPrintF(out, "no models registered\n");
    return;
  }
  absl::FPrintF(out, "%-20s %-12s %-32s %9s %12s %12s %13s %11s %s\n", "model", "format",
                "geometry", "bits/val", "slot", "fp32 slot", "slots", "ckpts", "layout");
  for (const v1::ModelInfo& m : models) {
    const v1::Geometry& g = m.geometry();
    const std::string geometry = absl::StrFormat(
        "%s L=%d Hqk=%d Hv=%d %dx%d", g.arch() == v1::ARCH_KDA ? "kda" : "gdn", g.layers(),
        g.h_qk(), g.h_v(), g.d_k(), g.d_v());
    absl::FPrintF(out, "%-20s %-12s %-32s %9.3f %12s %12s %6d/%-6d %5d/%-5d %s\n", m.model_id(),
                  m.format(), geometry, m.payload_bits_per_value(), HumanBytes(m.slot_bytes()),
                  HumanBytes(m.fp32_slot_bytes()), m.stats().slots_allocated(),
                  m.stats().slot_capacity(), m.stats().checkpoints(),
                  m.stats().checkpoint_capacity(),
                  absl::StrCat(m.identity_layout()
                                   ? "identity"
                                   : absl::StrFormat("calibrated %016x",
                                                     m.tags().layout_fingerprint()),
                               m.checkpoint_format().empty() || m.checkpoint_format() == m.format()
                                   ? ""
                                   : absl::StrCat(", cold checkpoints ", m.checkpoint_format())));
  }
}

std::string ModelsJson(const std::vector<v1::ModelInfo>& models) {
  JsonWriter w;
  w.BeginObject().Key("models").BeginArray();
  for (const v1::ModelInfo& m : models) w.Message(m);
  w.EndArray().EndObject();
  return w.str();
}

namespace {

absl::Status RunModels(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.bool_flags = {"json"};
  spec.positional = true;
  ASSIGN_OR_RETURN(CliFlags flags, ParseCommandFlags(args, spec));
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  std::vector<v1::ModelInfo> models;
  if (flags.positional().empty()) {
    ASSIGN_OR_RETURN(models, client->ListModels());
  } else {
    for (const std::string& id : flags.positional()) {
      ASSIGN_OR_RETURN(v1::ModelInfo info, client->DescribeModel(id));
      models.push_back(std::move(info));
    }
  }
  if (flags.Has("json")) {
    absl::FPrintF(ctx.out(), "%s\n", ModelsJson(models));
  } else {
    PrintModels(ctx.out(), models);
  }
  return absl::OkStatus();
}

}  // namespace

Command ModelsCommand() {
  Command c{"models", "registered models: format, geometry, sizes, slots, checkpoints",
            "models [--json] [MODEL_ID...]", RunModels};
  c.help =
      "  MODEL_ID...   only these models (NOT_FOUND for an unknown one); all when none\n"
      "  --json        {\"models\": [ModelInfo with proto field names, ...]}\n";
  return c;
}

}  // namespace statecache
