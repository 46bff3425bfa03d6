// statecachectl lookup | snapshot: the prefix cache by hand.
//
//   statecachectl lookup qwen --tokens=1,2,3,4 [--lease_ms=N | --peek] [--key_kind=sha256]
//   statecachectl lookup qwen --keys=0123456789abcdef@12,...
//   statecachectl snapshot qwen 0123456789abcdef/1 --tokens_file=prompt.txt
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/ctl/ctl_command.h"
#include "client/ctl/ctl_json.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

absl::Status RunLookup(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.value_flags = {"tokens", "tokens_file", "keys", "lease_ms", "key_kind"};
  spec.bool_flags = {"json", "peek"};
  spec.positional = true;
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  if (f.positional().size() != 1) return absl::InvalidArgumentError("lookup: want exactly one MODEL_ID");
  const std::string& model = f.positional()[0];
  ASSIGN_OR_RETURN(int lease_ms, f.GetInt("lease_ms", 0));
  if (lease_ms < 0) return absl::InvalidArgumentError("--lease_ms: must be >= 0");
  const bool peek = f.Has("peek");
  if (peek && lease_ms != 0) {
    return absl::InvalidArgumentError("--peek takes no lease; drop --lease_ms");
  }
  ASSIGN_OR_RETURN(const PrefixKeyKind key_kind, KeyKindFromFlags(f));
  std::vector<PrefixKey> keys;
  std::vector<int32_t> tokens;
  if (f.Has("keys")) {
    if (f.Has("tokens") || f.Has("tokens_file")) {
      return absl::InvalidArgumentError("give one of --tokens, --tokens_file or --keys");
    }
    for (absl::string_view k : absl::StrSplit(f.Get("keys", ""), ',', absl::SkipEmpty())) {
      ASSIGN_OR_RETURN(PrefixKey key, ParsePrefixKey(k, "--keys"));
      keys.push_back(key);
    }
    if (keys.empty()) return absl::InvalidArgumentError("--keys: no keys");
  } else {
    ASSIGN_OR_RETURN(tokens, TokensFromFlags(f));
  }
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  PrefixLookup r;
  if (peek) {
    LookupItem item;
    item.tokens = tokens;
    item.keys = keys;
    item.key_kind = key_kind;
    ASSIGN_OR_RETURN(r, client->PeekPrefix(model, item));
  } else if (keys.empty()) {
    ASSIGN_OR_RETURN(r, client->LookupPrefix(model, tokens, absl::Milliseconds(lease_ms),
                                             key_kind));
  } else {
    ASSIGN_OR_RETURN(r, client->LookupPrefixKeys(model, keys, absl::Milliseconds(lease_ms)));
  }
  std::FILE* out = ctx.out();
  if (f.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("model_id").String(model).Key("hit").Bool(r.hit);
    w.Key("candidate_tokens").Int(r.candidate_tokens);
    if (r.hit) {
      w.Key("key").String(r.key.DebugString()).Key("tokens").Int(r.key.num_tokens);
      if (!peek) {
        w.Key("lease_id").String(absl::StrFormat("%016x", r.lease_id));
        w.Key("lease_expiry_unix_ms").Int(absl::ToUnixMillis(r.lease_expiry));
      }
    }
    w.EndObject();
    absl::FPrintF(out, "%s\n", w.str());
  } else if (r.hit && peek) {
    absl::FPrintF(out, "hit %s: %d of %d tokens cached (peek: no lease)\n", r.key.DebugString(),
                  r.key.num_tokens, r.candidate_tokens);
  } else if (r.hit) {
    absl::FPrintF(out, "hit %s: %d of %d tokens cached, lease %016x until %s\n",
                  r.key.DebugString(), r.key.num_tokens, r.candidate_tokens, r.lease_id,
                  absl::FormatTime(absl::RFC3339_sec, r.lease_expiry, absl::UTCTimeZone()));
  } else {
    absl::FPrintF(out, "miss: none of %d candidate tokens cached\n", r.candidate_tokens);
  }
  return absl::OkStatus();
}

absl::Status RunSnapshot(CtlContext& ctx, const std::vector<std::string>& args) {
  CliFlags::Spec spec;
  spec.value_flags = {"tokens", "tokens_file", "key", "key_kind"};
  spec.bool_flags = {"json"};
  spec.positional = true;
  ASSIGN_OR_RETURN(CliFlags f, ParseCommandFlags(args, spec));
  if (f.positional().size() != 2) {
    return absl::InvalidArgumentError("snapshot: want MODEL_ID and HANDLE");
  }
  const std::string& model = f.positional()[0];
  ASSIGN_OR_RETURN(SlotHandle slot, ParseSlotHandle(f.positional()[1], "HANDLE"));
  std::vector<int32_t> tokens;
  PrefixKey key;
  if (f.Has("key")) {
    if (f.Has("tokens") || f.Has("tokens_file")) {
      return absl::InvalidArgumentError("give one of --tokens, --tokens_file or --key");
    }
    ASSIGN_OR_RETURN(key, ParsePrefixKey(f.Get("key", ""), "--key"));
  } else {
    ASSIGN_OR_RETURN(tokens, TokensFromFlags(f));
  }
  ASSIGN_OR_RETURN(StateCacheClient * client, ctx.client());
  PrefixKey stored;
  if (f.Has("key")) {
    ASSIGN_OR_RETURN(stored, client->SnapshotKey(model, slot, key));
  } else {
    ASSIGN_OR_RETURN(const PrefixKeyKind key_kind, KeyKindFromFlags(f));
    ASSIGN_OR_RETURN(stored, client->Snapshot(model, slot, tokens, {}, key_kind));
  }
  if (f.Has("json")) {
    JsonWriter w;
    w.BeginObject().Key("model_id").String(model).Key("slot").String(slot.DebugString());
    w.Key("key").String(stored.DebugString()).Key("tokens").Int(stored.num_tokens).EndObject();
    absl::FPrintF(ctx.out(), "%s\n", w.str());
  } else {
    absl::FPrintF(ctx.out(), "checkpoint %s of slot %s\n", stored.DebugString(),
                  slot.DebugString());
  }
  return absl::OkStatus();
}

constexpr char kPrefixHelp[] =
    "  --tokens=LIST         token ids, comma / space separated (every prefix is a candidate)\n"
    "  --tokens_file=FILE    the same, read from a file\n"
    "  --key_kind=KIND       the chain the server computes from tokens: fnv64 (default) or\n"
    "                        sha256 (issue 31; both are accepted during the migration)\n";

}  // namespace

Command LookupCommand() {
  Command c{"lookup", "longest cached prefix of a token sequence (takes a lease on a hit)",
            "lookup MODEL_ID (--tokens=LIST | --tokens_file=FILE | --keys=KEYS) "
            "[--key_kind=KIND] [--lease_ms=N | --peek] [--json]",
            RunLookup};
  c.help = absl::StrCat(
      kPrefixHelp,
      "  --keys=HASH@N,...     chained prefix keys instead of tokens\n"
      "  --lease_ms=N          lease on a hit (0 = the server's --lease_default_ms); the lease\n"
      "                        pins the checkpoint until it expires\n"
      "  --peek                answer without a lease (and without counting as a lookup)\n"
      "  --json                {model_id, hit, candidate_tokens, key, tokens, lease_id,\n"
      "                        lease_expiry_unix_ms}\n");
  return c;
}

Command SnapshotCommand() {
  Command c{"snapshot", "checkpoint a slot's state under the prefix it has consumed",
            "snapshot MODEL_ID HANDLE (--tokens=LIST | --tokens_file=FILE | --key=HASH@N) "
            "[--key_kind=KIND] [--json]",
            RunSnapshot};
  c.help = absl::StrCat(kPrefixHelp,
                        "  --key=HASH@N          the chained key instead of tokens\n"
                        "  --json                {model_id, slot, key, tokens}\n");
  return c;
}

}  // namespace statecache
