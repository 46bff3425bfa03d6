// statecachectl export | import: a slot's packed state to / from a file;
// unpack: a slot's or a checkpoint's states as FP32 to a file.
//
//   statecachectl export qwen 0123456789abcdef/1 --out=slot.scstate
//   statecachectl import qwen --in=slot.scstate            (allocates a slot)
//   statecachectl import qwen 0123456789abcdef/2 --in=slot.scstate
//   statecachectl unpack qwen 0123456789abcdef/1 --out=states.f32
//   statecachectl unpack qwen --tokens=1,2,3 --key_kind=sha256 --out=states.f32
//
// File: the line "statecache-slot v1\n", then the protobuf binary encoding
// of statecache.v1.ExportResponse (compatibility tags + packed bytes). The
// server checks every tag on import (FAILED_PRECONDITION naming the one that
// differs), so a state never lands in a model of another geometry, format
// or layout.
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl/ctl_json.h"
#include "kernels/common/status_macros.h"
#include "server/pool/prefix_key.h"

namespace statecache {
namespace {

constexpr absl::string_view kMagic = "statecache-slot v1\n";

void PrintResult(CtlContext& ctx, const CliFlags& f, absl::string_view verb,
                 const std::string& model, SlotHandle slot, const v1::CompatibilityTags& tags,
                 const std::string& path) {
  if (f.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("model_id").String(model).Key("slot").String(slot.DebugString());
    w.Key("file").String(path).Key("tags").Message(tags).EndObject();
    absl::FPrintF(ctx.out(), "%s\n", w.str());
  } else {
    absl::FPrintF(ctx.out(), "%s slot %s of %s (%s, layout %016x, %s) %s %s\n", verb,
                  slot.DebugString(), model, tags.format(), tags.layout_fingerprint(),
                  HumanBytes(tags.slot_bytes()), verb == "exported" ? "to" : "from", path);
  }
}

absl::Status RunExport(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.value_flags = {"out"};
  spec.bool_flags = {"json"};
  spec.positional = true;
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  if (f.positional().size() != 2) return absl::InvalidArgumentError("export: want MODEL_ID and HANDLE");
  if (!f.Has("out")) return absl::InvalidArgumentError("export: --out=FILE is required");
  const std::string& model = f.positional()[0];
  ASSIGN_OR_RETURN(SlotHandle slot, ParseSlotHandle(f.positional()[1], "HANDLE"));
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  ASSIGN_OR_RETURN(ExportedState state, client->Export(model, slot));
  v1::ExportResponse file;
  *file.mutable_tags() = state.tags;
  file.set_packed(std::move(state.packed));
  RETURN_IF_ERROR(
      WriteFileBytes(f.Get("out", ""), absl::StrCat(kMagic, file.SerializeAsString()), "--out"));
  PrintResult(ctx, f, "exported", model, slot, file.tags(), f.Get("out", ""));
  return absl::OkStatus();
}

absl::Status RunImport(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.value_flags = {"in"};
  spec.bool_flags = {"json"};
  spec.positional = true;
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  if (f.positional().empty() || f.positional().size() > 2) {
    return absl::InvalidArgumentError("import: want MODEL_ID [HANDLE]");
  }
  if (!f.Has("in")) return absl::InvalidArgumentError("import: --in=FILE is required");
  const std::string& model = f.positional()[0];
  const std::string path = f.Get("in", "");
  ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(path, "--in"));
  v1::ExportResponse file;
  if (!absl::StartsWith(bytes, kMagic) || !file.ParseFromArray(bytes.data() + kMagic.size(),
                                                               bytes.size() - kMagic.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--in: ", path, " is not a slot file of `statecachectl export`"));
  }
  if (static_cast<int64_t>(file.packed().size()) != file.tags().slot_bytes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--in: %s holds %d packed bytes, its tags say %d", path, file.packed().size(),
        file.tags().slot_bytes()));
  }
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  SlotHandle slot;
  const bool allocated = f.positional().size() == 1;
  if (allocated) {
    ASSIGN_OR_RETURN(std::vector<SlotHandle> slots, client->AllocateSlots(model, 1));
    slot = slots[0];
  } else {
    ASSIGN_OR_RETURN(slot, ParseSlotHandle(f.positional()[1], "HANDLE"));
  }
  absl::Status imported = client->Import(model, slot, ExportedState{file.tags(), file.packed()});
  if (!imported.ok()) {
    if (allocated) client->ReleaseSlots(model, {slot}).IgnoreError();
    return imported;
  }
  PrintResult(ctx, f, "imported", model, slot, file.tags(), path);
  return absl::OkStatus();
}

// The checkpoint key of unpack: --key=HASH@TOKENS, or computed from
// --tokens / --tokens_file with --key_kind (the chain the snapshot used).
absl::StatusOr<PrefixKey> UnpackKey(const CliFlags& f) {
  if (f.Has("key")) {
    if (f.Has("tokens") || f.Has("tokens_file") || f.Has("key_kind")) {
      return absl::InvalidArgumentError("give --key or --tokens / --tokens_file, not both");
    }
    return ParsePrefixKey(f.Get("key", ""), "--key");
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> tokens, TokensFromFlags(f));
  ASSIGN_OR_RETURN(const PrefixKeyKind kind, KeyKindFromFlags(f));
  return kind == PrefixKeyKind::kSha256 ? Sha256KeyOfTokens(tokens) : KeyOfTokens(tokens);
}

absl::Status RunUnpack(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.value_flags = {"out", "key", "tokens", "tokens_file", "key_kind", "lease"};
  spec.bool_flags = {"json"};
  spec.positional = true;
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  const bool by_key = f.Has("key") || f.Has("tokens") || f.Has("tokens_file");
  if (f.positional().size() != (by_key ? 1u : 2u)) {
    return absl::InvalidArgumentError(
        "unpack: want MODEL_ID and HANDLE, or MODEL_ID and --key / --tokens / --tokens_file");
  }
  if (!f.Has("out")) return absl::InvalidArgumentError("unpack: --out=FILE is required");
  uint64_t lease = 0;
  if (f.Has("lease")) {
    if (!by_key) return absl::InvalidArgumentError("--lease: only with a checkpoint key");
    if (!absl::SimpleHexAtoi(f.Get("lease", ""), &lease)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lease: '", f.Get("lease", ""), "' is not a hex lease id of lookup"));
    }
  }
  const std::string& model = f.positional()[0];
  std::string source;
  absl::StatusOr<std::vector<float>> states;
  if (by_key) {
    ASSIGN_OR_RETURN(const PrefixKey key, UnpackKey(f));
    source = absl::StrCat("checkpoint ", key.DebugString());
    ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
    states = client->UnpackCheckpoint(model, key, lease);
  } else {
    ASSIGN_OR_RETURN(SlotHandle slot, ParseSlotHandle(f.positional()[1], "HANDLE"));
    source = absl::StrCat("slot ", slot.DebugString());
    ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
    states = client->Unpack(model, slot);
  }
  RETURN_IF_ERROR(states.status());
  const std::string path = f.Get("out", "");
  RETURN_IF_ERROR(WriteFileBytes(
      path,
      absl::string_view(reinterpret_cast<const char*>(states->data()), states->size() * 4),
      "--out"));
  if (f.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("model_id").String(model).Key("source").String(source);
    w.Key("file").String(path).Key("values").Int(states->size()).EndObject();
    absl::FPrintF(ctx.out(), "%s\n", w.str());
  } else {
    absl::FPrintF(ctx.out(), "unpacked %s of %s: %d float32 values (%s) to %s\n", source, model,
                  states->size(), HumanBytes(states->size() * 4), path);
  }
  return absl::OkStatus();
}

}  // namespace

Command UnpackCommand() {
  Command c{"unpack", "write a slot's or a checkpoint's states as FP32 to a file",
            "unpack MODEL_ID (HANDLE | --key=HASH@TOKENS | --tokens=LIST [--key_kind=K]) "
            "[--lease=HEX] --out=FILE [--json]",
            RunUnpack};
  c.help =
      "  HANDLE              an allocated slot\n"
      "  --key=HASH@TOKENS   a checkpoint by its FNV-1a key (as lookup prints it)\n"
      "  --tokens=LIST       a checkpoint by its prefix's tokens (or --tokens_file=FILE);\n"
      "  --key_kind=KIND     fnv64 (default) or sha256: the chain its snapshot used\n"
      "  --lease=HEX         a lookup lease of the checkpoint (read, not consumed)\n"
      "  --out=FILE          little-endian float32 [layers][h_v][d_k][d_v], natural key\n"
      "                      order; the server refuses states over --max_unpack_bytes\n"
      "  --json              {model_id, source, file, values}\n";
  return c;
}

Command ExportCommand() {
  Command c{"export", "write a slot's packed state (and its compatibility tags) to a file",
            "export MODEL_ID HANDLE --out=FILE [--json]", RunExport};
  c.help =
      "  --out=FILE   \"statecache-slot v1\\n\" + the protobuf encoding of\n"
      "               statecache.v1.ExportResponse (tags, packed bytes)\n"
      "  --json       {model_id, slot, file, tags}\n";
  return c;
}

Command ImportCommand() {
  Command c{"import", "load a slot file of `export` into a slot (a new one without HANDLE)",
            "import MODEL_ID [HANDLE] --in=FILE [--json]", RunImport};
  c.help =
      "  HANDLE      overwrite this allocated slot; without it a slot is allocated (and\n"
      "              released again if the import fails) and its handle printed\n"
      "  --in=FILE   a file of `statecachectl export`; the server refuses a state whose\n"
      "              model, format, layout or geometry tags differ (FAILED_PRECONDITION)\n"
      "  --json      {model_id, slot, file, tags}\n";
  return c;
}

}  // namespace statecache
