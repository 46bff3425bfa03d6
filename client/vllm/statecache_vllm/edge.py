"""The plugin's edge: the one place that reads the process environment.

plugin_config(vllm_config) is what every vLLM-facing class calls; it returns
None when the plugin is not configured (then they behave as vLLM's own).
"""
from __future__ import annotations

import os
from typing import Any, Optional

from statecache_vllm.config import PluginConfig, resolve


def plugin_config(vllm_config: Any) -> Optional[PluginConfig]:
    """The PluginConfig of this engine (additional_config["statecache"], else
    $STATECACHE_VLLM), or None. ConfigError names a bad key."""
    return resolve(getattr(vllm_config, "additional_config", None), os.environ)


def environ():
    """The process environment (a spawned statecached inherits it)."""
    return os.environ
