// statecachectl slots: per-model slot use, allocate and release slots.
//
//   statecachectl slots list [MODEL_ID...]
//   statecachectl slots allocate MODEL_ID [--count=N]    (prints the handles)
//   statecachectl slots release MODEL_ID HANDLE...
//
// statecache.v1 has no RPC that enumerates the handles of allocated slots
// (they are capabilities of the worker that holds them), so `list` shows the
// counts the server keeps per model: allocated, capacity, free.
#include "absl/strings/str_format.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl/ctl_json.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

constexpr char kSubcommands[] = "list, allocate, release";

absl::Status List(CtlContext& ctx, const CliFlags& f, absl::Span<const std::string> ids) {
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  std::vector<v1::ModelInfo> models;
  if (ids.empty()) {
    ASSIGN_OR_RETURN(models, client->ListModels());
  } else {
    for (const std::string& id : ids) {
      ASSIGN_OR_RETURN(v1::ModelInfo m, client->DescribeModel(id));
      models.push_back(std::move(m));
    }
  }
  std::FILE* out = ctx.out();
  if (f.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("models").BeginArray();
    for (const v1::ModelInfo& m : models) {
      const v1::ModelStats& s = m.stats();
      w.BeginObject().Key("model_id").String(m.model_id());
      w.Key("slots_allocated").Int(s.slots_allocated()).Key("slot_capacity").Int(s.slot_capacity());
      w.Key("slots_free").Int(s.slot_capacity() - s.slots_allocated());
      w.Key("slot_bytes").Int(m.slot_bytes()).EndObject();
    }
    w.EndArray().EndObject();
    absl::FPrintF(out, "%s\n", w.str());
    return absl::OkStatus();
  }
  absl::FPrintF(out, "%-20s %9s %9s %9s %12s\n", "model", "allocated", "capacity", "free",
                "slot");
  for (const v1::ModelInfo& m : models) {
    const v1::ModelStats& s = m.stats();
    absl::FPrintF(out, "%-20s %9d %9d %9d %12s\n", m.model_id(), s.slots_allocated(),
                  s.slot_capacity(), s.slot_capacity() - s.slots_allocated(),
                  HumanBytes(m.slot_bytes()));
  }
  return absl::OkStatus();
}

absl::Status Allocate(CtlContext& ctx, const CliFlags& f, absl::Span<const std::string> ids) {
  if (ids.size() != 1) return absl::InvalidArgumentError("slots allocate: want exactly one MODEL_ID");
  ASSIGN_OR_RETURN(int count, f.GetInt("count", 1));
  if (count < 1) return absl::InvalidArgumentError("--count: must be >= 1");
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  ASSIGN_OR_RETURN(std::vector<SlotHandle> slots, client->AllocateSlots(ids[0], count));
  if (f.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("model_id").String(ids[0]).Key("slots").BeginArray();
    for (const SlotHandle& h : slots) w.String(h.DebugString());
    w.EndArray().EndObject();
    absl::FPrintF(ctx.out(), "%s\n", w.str());
  } else {
    for (const SlotHandle& h : slots) absl::FPrintF(ctx.out(), "%s\n", h.DebugString());
  }
  return absl::OkStatus();
}

absl::Status Release(CtlContext& ctx, const CliFlags& f, absl::Span<const std::string> args) {
  if (args.size() < 2) {
    return absl::InvalidArgumentError("slots release: want MODEL_ID and at least one HANDLE");
  }
  std::vector<SlotHandle> slots;
  for (size_t i = 1; i < args.size(); ++i) {
    ASSIGN_OR_RETURN(SlotHandle h, ParseSlotHandle(args[i], "HANDLE"));
    slots.push_back(h);
  }
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  RETURN_IF_ERROR(client->ReleaseSlots(args[0], slots));
  if (f.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("model_id").String(args[0]).Key("released").Int(slots.size()).EndObject();
    absl::FPrintF(ctx.out(), "%s\n", w.str());
  } else {
    absl::FPrintF(ctx.out(), "released %d slot(s) of %s\n", slots.size(), args[0]);
  }
  return absl::OkStatus();
}

absl::Status RunSlots(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.value_flags = {"count"};
  spec.bool_flags = {"json"};
  spec.positional = true;
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  if (f.positional().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("slots: missing subcommand (", kSubcommands, ")"));
  }
  const std::string& sub = f.positional()[0];
  absl::Span<const std::string> rest = absl::MakeConstSpan(f.positional()).subspan(1);
  if (sub == "list") return List(ctx, f, rest);
  if (sub == "allocate") return Allocate(ctx, f, rest);
  if (sub == "release") return Release(ctx, f, rest);
  return absl::InvalidArgumentError(
      absl::StrCat("slots: unknown subcommand '", sub, "'",
                   DidYouMean(sub, {"list", "allocate", "release"}), " (", kSubcommands, ")"));
}

}  // namespace

Command SlotsCommand() {
  Command c{"slots", "slots of a model: list (counts), allocate, release",
            "slots list [MODEL_ID...] | slots allocate MODEL_ID [--count=N] | "
            "slots release MODEL_ID HANDLE... [--json]",
            RunSlots};
  c.help =
      "  list [MODEL_ID...]         allocated / capacity / free per model (the server keeps\n"
      "                             counts; handles are known only to the worker holding them)\n"
      "  allocate MODEL_ID          allocate --count=N slots (default 1), print their handles\n"
      "  release MODEL_ID HANDLE... release slots by handle (ID/GENERATION, as allocate prints)\n"
      "  --json                     machine-readable output\n";
  return c;
}

}  // namespace statecache
