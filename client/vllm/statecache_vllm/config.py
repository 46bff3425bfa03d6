"""The plugin's configuration: one frozen dataclass parsed at the edge.

Sources, first found wins (resolve()):
  1. vLLM's additional_config["statecache"]   (LLM(additional_config=...),
     `vllm serve --additional-config '{"statecache": {...}}'`)
  2. the environment variable STATECACHE_VLLM, a JSON object with the same keys
The plugin is active only when one of them is present; otherwise every
replaced class behaves exactly like vLLM's own.

Keys (all optional; unknown keys are an error naming the key):
  format          statecache format of the pool, "damp:16" (any format
                  statecached accepts except stepquant-*, whose heads have
                  per-(layer, head) sizes)
  storage         "pages" (default): statecache's ops over the packed state
                  area of vLLM's own KV-cache pages, no server - the state
                  memory is what vLLM allocates and counts; "server": the
                  states in a statecached pool (target / spawn below), vLLM's
                  pages unused. The keys target .. lease_ms and drop_existing
                  apply to "server" only
  prefill         "statecache" (default): prefill chunks through statecache's
                  prefill op from the stored state, quantized once; "runtime":
                  through vLLM's own chunk kernel (chunk_gated_delta_rule, the
                  stock arithmetic) between unpack and pack ("pages" storage)
  target          gRPC target of a running statecached ("unix:/run/sc.sock",
                  "127.0.0.1:50051"); "{rank}" is replaced by the TP rank.
                  Empty: the plugin starts its own statecached (spawn)
  statecached     path of the statecached binary for spawn (default: "statecached"
                  on PATH)
  spawn_args      extra command-line flags for a spawned statecached (list of str)
  model_id        prefix of the model id registered per rank:
                  "<model_id>.tp<T>.r<R>" (default "vllm-gdn")
  token           tenant token for a server with --tenants_file ("" = none)
  layout_file     calibrated layout file (statecachectl calibrate --out); its
                  layers must be the pool's layers (see README: positions)
  check_every     vLLM steps between checks of the device error record (>= 1)
  library         path of libstatecache_dataplane.so ("" = statecache's default lookup)
  lease_ms        attach lease (0 = the server's default)
  drop_existing   drop a model of the same id left by an earlier engine (bool)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional, Tuple

ENV_VAR = "STATECACHE_VLLM"
ADDITIONAL_CONFIG_KEY = "statecache"

# Formats whose head size depends on the calibrated layout (not supported).
_PER_HEAD_FORMATS = ("stepquant",)
_UNIFORM = ("fp32", "fp16", "bf16", "int8", "int8-hadamard", "int4", "int4-hadamard",
            "fp8-e4m3", "nvfp4")
_MIXED = ("damp", "damp-sr")
STORAGES = ("pages", "server")
PREFILLS = ("statecache", "runtime")
DEFAULT_K_HI = 16


class ConfigError(ValueError):
    """A bad plugin configuration; the message names the key."""


@dataclass(frozen=True)
class FormatSpec:
    """A parsed statecache format: name and k_hi (damp / damp-sr only)."""
    name: str
    k_hi: int = 0

    @property
    def text(self) -> str:
        return f"{self.name}:{self.k_hi}" if self.name in _MIXED else self.name


def parse_format(text: Any, key: str = "format") -> FormatSpec:
    """'<name>' or '<name>:<k_hi>' (the suffix for damp / damp-sr only; their
    default k_hi is 16), as statecached's ParseFormatSpec reads it."""
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{key}: {text!r} is not a format name")
    name, _, suffix = text.strip().lower().partition(":")
    if name.startswith(_PER_HEAD_FORMATS):
        raise ConfigError(f"{key}: '{text}': stepquant formats have per-head sizes; the plugin "
                          "needs one head size for vLLM's page (use damp, int8, fp16, ...)")
    if name not in _UNIFORM + _MIXED:
        raise ConfigError(f"{key}: '{text}' is not one of {', '.join(_UNIFORM + _MIXED)}")
    if name in _MIXED:
        if not suffix:
            return FormatSpec(name, DEFAULT_K_HI)
        if not suffix.isdigit():
            raise ConfigError(f"{key}: '{text}': k_hi must be a non-negative integer")
        return FormatSpec(name, int(suffix))
    if suffix:
        raise ConfigError(f"{key}: '{text}': only damp and damp-sr take a ':<k_hi>' suffix")
    return FormatSpec(name, 0)


@dataclass(frozen=True)
class PluginConfig:
    format: FormatSpec = field(default_factory=lambda: FormatSpec("damp", DEFAULT_K_HI))
    storage: str = "pages"
    prefill: str = "statecache"
    target: str = ""
    statecached: str = "statecached"
    spawn_args: Tuple[str, ...] = ()
    model_id: str = "vllm-gdn"
    token: str = ""
    layout_file: str = ""
    check_every: int = 16
    library: str = ""
    lease_ms: int = 0
    drop_existing: bool = False

    @property
    def spawn(self) -> bool:
        """True when the plugin starts its own statecached ("server" storage,
        no target)."""
        return self.storage == "server" and not self.target

    def rank_target(self, rank: int) -> str:
        return self.target.replace("{rank}", str(rank))

    def rank_model_id(self, tp_size: int, rank: int) -> str:
        return f"{self.model_id}.tp{tp_size}.r{rank}"


_KEYS = {f.name for f in fields(PluginConfig)}


def _typed(raw: Mapping[str, Any], key: str, kind, default):
    if key not in raw:
        return default
    v = raw[key]
    if kind is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{key}: {v!r} is not true or false")
        return v
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{key}: {v!r} is not an integer")
        return v
    if not isinstance(v, str):
        raise ConfigError(f"{key}: {v!r} is not a string")
    return v


def parse(raw: Mapping[str, Any]) -> PluginConfig:
    """PluginConfig from a mapping of the keys above; ConfigError naming the
    first bad key."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"statecache: {raw!r} is not a mapping of settings")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown setting (known: {', '.join(sorted(_KEYS))})")
    d = PluginConfig()
    spawn_args = raw.get("spawn_args", ())
    if not isinstance(spawn_args, (list, tuple)) or not all(isinstance(a, str)
                                                            for a in spawn_args):
        raise ConfigError(f"spawn_args: {spawn_args!r} is not a list of strings")
    cfg = PluginConfig(
        format=parse_format(raw["format"]) if "format" in raw else d.format,
        storage=_typed(raw, "storage", str, d.storage),
        prefill=_typed(raw, "prefill", str, d.prefill),
        target=_typed(raw, "target", str, d.target).strip(),
        statecached=_typed(raw, "statecached", str, d.statecached),
        spawn_args=tuple(spawn_args),
        model_id=_typed(raw, "model_id", str, d.model_id),
        token=_typed(raw, "token", str, d.token),
        layout_file=_typed(raw, "layout_file", str, d.layout_file),
        check_every=_typed(raw, "check_every", int, d.check_every),
        library=_typed(raw, "library", str, d.library),
        lease_ms=_typed(raw, "lease_ms", int, d.lease_ms),
        drop_existing=_typed(raw, "drop_existing", bool, d.drop_existing),
    )
    if cfg.storage not in STORAGES:
        raise ConfigError(f"storage: {cfg.storage!r} is not one of {', '.join(STORAGES)}")
    if cfg.prefill not in PREFILLS:
        raise ConfigError(f"prefill: {cfg.prefill!r} is not one of {', '.join(PREFILLS)}")
    if cfg.prefill == "runtime" and cfg.storage != "pages":
        raise ConfigError("prefill: 'runtime' needs storage 'pages' (one layer per pool: the "
                          "pack after vLLM's chunk kernel rewrites whole slots)")
    if cfg.check_every < 1:
        raise ConfigError(f"check_every: {cfg.check_every} must be >= 1")
    if cfg.lease_ms < 0:
        raise ConfigError(f"lease_ms: {cfg.lease_ms} must be >= 0")
    if not cfg.model_id or any(c.isspace() for c in cfg.model_id):
        raise ConfigError(f"model_id: {cfg.model_id!r} must be a non-empty id without spaces")
    if cfg.spawn and not cfg.statecached:
        raise ConfigError("statecached: empty; give target= or the statecached binary to spawn")
    return cfg


def resolve(additional_config: Any, environ: Mapping[str, str]) -> Optional[PluginConfig]:
    """The plugin's config from vLLM's additional_config, else $STATECACHE_VLLM
    (JSON), else None (plugin inactive)."""
    if isinstance(additional_config, Mapping) and ADDITIONAL_CONFIG_KEY in additional_config:
        return parse(additional_config[ADDITIONAL_CONFIG_KEY])
    text = environ.get(ENV_VAR, "")
    if not text.strip():
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{ENV_VAR}: not JSON ({e.msg} at {e.pos})") from None
    return parse(raw)
