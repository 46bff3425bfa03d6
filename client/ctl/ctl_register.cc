// statecachectl register | drop: add a model to the server / remove one.
//
//   statecachectl register qwen --layout=qwen.damp16.safetensors --slots=64 --checkpoints=256
//   statecachectl register tiny --geometry=arch=gdn,layers=2,h_qk=1,h_v=2,d_k=32,d_v=32 \
//       --format=fp32 --slots=4
//   statecachectl drop qwen [--force]
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl/ctl_json.h"
#include "kernels/common/status_macros.h"
#include "kernels/formats/format.h"
#include "kernels/layout/layout_file.h"

namespace statecache {
namespace {

absl::StatusOr<int64_t> GetInt64(const CliFlags& f, const std::string& name) {
  int64_t v = 0;
  if (f.Has(name) && (!absl::SimpleAtoi(f.Get(name, ""), &v) || v < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", f.Get(name, ""), "' is not a non-negative integer"));
  }
  return v;
}

absl::Status RunRegister(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.value_flags = {"geometry", "format", "layout", "slots",
                      "checkpoints", "max_state_bytes", "max_checkpoint_bytes",
                      "checkpoint_format"};
  spec.bool_flags = {"json"};
  spec.positional = true;
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  if (f.positional().size() != 1) {
    return absl::InvalidArgumentError("register: want exactly one MODEL_ID");
  }
  ModelRegistration r;
  r.model_id = f.positional()[0];
  if (f.Has("layout")) {
    ASSIGN_OR_RETURN(r.layout_file, ReadFileBytes(f.Get("layout", ""), "--layout"));
    // The file's own geometry and format, unless given (the server then
    // checks that they match).
    ASSIGN_OR_RETURN(LayoutFile lf, ParseLayout(r.layout_file, nullptr, nullptr));
    r.geometry = lf.layout.geometry();
    r.format = FormatSpecName(lf.layout.format());
  } else if (!f.Has("geometry")) {
    return absl::InvalidArgumentError("register: give --geometry, --layout or both");
  }
  if (f.Has("geometry")) {
    ASSIGN_OR_RETURN(r.geometry, ParseGeometrySpec(f.Get("geometry", "")));
  }
  if (f.Has("format")) {
    r.format = f.Get("format", "");
  } else if (!f.Has("layout")) {
    return absl::InvalidArgumentError("register: --format is required without --layout");
  }
  ASSIGN_OR_RETURN(r.slots, GetInt64(f, "slots"));
  ASSIGN_OR_RETURN(r.checkpoints, GetInt64(f, "checkpoints"));
  ASSIGN_OR_RETURN(r.max_state_bytes, GetInt64(f, "max_state_bytes"));
  ASSIGN_OR_RETURN(r.max_checkpoint_bytes, GetInt64(f, "max_checkpoint_bytes"));
  r.checkpoint_format = f.Get("checkpoint_format", "");
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  ASSIGN_OR_RETURN(v1::ModelInfo info, client->RegisterModel(r));
  if (f.Has("json")) {
    absl::FPrintF(ctx.out(), "%s\n", ModelsJson({info}));
  } else {
    PrintModels(ctx.out(), {info});
  }
  return absl::OkStatus();
}

absl::Status RunDrop(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.bool_flags = {"force", "json"};
  spec.positional = true;
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  if (f.positional().size() != 1) return absl::InvalidArgumentError("drop: want exactly one MODEL_ID");
  const std::string& id = f.positional()[0];
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  RETURN_IF_ERROR(client->DropModel(id, f.Has("force")));
  if (f.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("dropped").String(id).EndObject();
    absl::FPrintF(ctx.out(), "%s\n", w.str());
  } else {
    absl::FPrintF(ctx.out(), "dropped %s\n", id);
  }
  return absl::OkStatus();
}

}  // namespace

Command RegisterCommand() {
  Command c{"register", "register a model: geometry + format, or a calibrated layout file",
            "register MODEL_ID (--layout=FILE | --geometry=SPEC --format=FMT) [--slots=N] "
            "[--checkpoints=N] [--json]",
            RunRegister};
  c.help =
      "  --layout=FILE             layout file of `statecachectl calibrate --out` (geometry and\n"
      "                            format are taken from it unless given)\n"
      "  --geometry=SPEC           arch=gdn,layers=4,h_qk=2,h_v=4,d_k=128,d_v=128[,scale=X]\n"
      "  --format=FMT              damp[:K], damp-sr[:K], fp32, bf16, fp16, int8, int8-hadamard,\n"
      "                            int4, int4-hadamard, fp8-e4m3, nvfp4\n"
      "  --slots=N                 live slots to preallocate (0 = the remaining state budget)\n"
      "  --checkpoints=N           checkpoints (0 = the remaining checkpoint budget)\n"
      "  --max_state_bytes=N       cap of the slots=0 default (0 = none)\n"
      "  --max_checkpoint_bytes=N  cap of the checkpoints=0 default (0 = none)\n"
      "  --checkpoint_format=FMT   format of the checkpoints in the host / disk / Redis tiers\n"
      "                            (e.g. int4-hadamard; default: statecached --checkpoint_format,\n"
      "                            else --format): transcoded on eviction, back on a hit\n"
      "  --json                    {\"models\": [ModelInfo]} instead of the table\n";
  return c;
}

Command DropCommand() {
  Command c{"drop", "drop a registered model (its slots and checkpoints are freed)",
            "drop MODEL_ID [--force] [--json]", RunDrop};
  c.help =
      "  --force   drop even while slots are allocated or checkpoints leased\n"
      "            (FAILED_PRECONDITION without it)\n"
      "  --json    {\"dropped\": MODEL_ID}\n";
  return c;
}

}  // namespace statecache
