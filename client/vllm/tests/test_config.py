"""Config parsing: defaults, every key, errors naming the key, sources."""
import json

import pytest

from statecache_vllm.config import (ADDITIONAL_CONFIG_KEY, ENV_VAR, ConfigError, FormatSpec,
                                    PluginConfig, parse, parse_format, resolve)


def test_defaults():
    cfg = parse({})
    assert cfg == PluginConfig()
    assert cfg.format == FormatSpec("damp", 16) and cfg.format.text == "damp:16"
    assert cfg.storage == "pages" and cfg.prefill == "statecache" and not cfg.spawn
    assert cfg.check_every == 16 and cfg.model_id == "vllm-gdn"
    assert parse({"storage": "server"}).spawn   # no target: the plugin starts statecached


def test_every_key():
    cfg = parse({"format": "int8-hadamard", "storage": "server",
                 "target": " unix:/run/sc{rank}.sock ",
                 "statecached": "/opt/sc/statecached", "spawn_args": ["--max_batch=8192"],
                 "model_id": "qwen36", "token": "t0k", "layout_file": "/l.bin",
                 "check_every": 4, "library": "/x/lib.so", "lease_ms": 60000,
                 "drop_existing": True})
    assert cfg.format == FormatSpec("int8-hadamard", 0) and cfg.storage == "server"
    assert not cfg.spawn and cfg.rank_target(3) == "unix:/run/sc3.sock"
    assert cfg.spawn_args == ("--max_batch=8192",)
    assert cfg.rank_model_id(2, 1) == "qwen36.tp2.r1"
    assert (cfg.token, cfg.layout_file, cfg.check_every, cfg.library, cfg.lease_ms,
            cfg.drop_existing) == ("t0k", "/l.bin", 4, "/x/lib.so", 60000, True)


@pytest.mark.parametrize("text,want", [("damp", FormatSpec("damp", 16)),
                                       ("DAMP:32", FormatSpec("damp", 32)),
                                       ("damp-sr:0", FormatSpec("damp-sr", 0)),
                                       ("fp32", FormatSpec("fp32", 0)),
                                       ("nvfp4", FormatSpec("nvfp4", 0))])
def test_formats(text, want):
    assert parse_format(text) == want


@pytest.mark.parametrize("raw,needle", [
    ({"format": "int3"}, "format: 'int3' is not one of"),
    ({"format": "fp16:8"}, "format: 'fp16:8': only damp and damp-sr"),
    ({"format": "damp:x"}, "format: 'damp:x': k_hi must be"),
    ({"format": "stepquant-6"}, "format: 'stepquant-6': stepquant formats have per-head"),
    ({"format": 16}, "format: 16 is not a format name"),
    ({"check_every": 0}, "check_every: 0 must be >= 1"),
    ({"check_every": "4"}, "check_every: '4' is not an integer"),
    ({"check_every": True}, "check_every: True is not an integer"),
    ({"lease_ms": -1}, "lease_ms: -1 must be >= 0"),
    ({"drop_existing": 1}, "drop_existing: 1 is not true or false"),
    ({"model_id": "a b"}, "model_id: 'a b' must be"),
    ({"spawn_args": "--x"}, "spawn_args: '--x' is not a list"),
    ({"statecached": "", "storage": "server"}, "statecached: empty"),
    ({"storage": "disk"}, "storage: 'disk' is not one of pages, server"),
    ({"prefill": "fla"}, "prefill: 'fla' is not one of statecache, runtime"),
    ({"prefill": "runtime", "storage": "server"}, "prefill: 'runtime' needs storage 'pages'"),
    ({"fromat": "damp"}, "fromat: unknown setting"),
])
def test_errors_name_the_key(raw, needle):
    with pytest.raises(ConfigError) as e:
        parse(raw)
    assert needle in str(e.value)


def test_not_a_mapping():
    with pytest.raises(ConfigError, match="statecache: 'damp' is not a mapping"):
        parse("damp")


def test_sources():
    env = {ENV_VAR: json.dumps({"format": "fp32", "target": "127.0.0.1:1"})}
    assert resolve(None, {}) is None
    assert resolve({"other": 1}, {ENV_VAR: "  "}) is None
    assert resolve({}, env).format.text == "fp32"
    # additional_config wins over the environment
    cfg = resolve({ADDITIONAL_CONFIG_KEY: {"format": "bf16"}}, env)
    assert cfg.format.text == "bf16" and cfg.target == ""
    with pytest.raises(ConfigError, match=f"{ENV_VAR}: not JSON"):
        resolve(None, {ENV_VAR: "{format: damp}"})
