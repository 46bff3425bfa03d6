"""statecache as the recurrent-state cache of model runtimes (issue 27).

- `statecache.integrations.transformers`: Hugging Face transformers'
  Qwen3-Next / Qwen3.5 models (`StatecacheCache`, passed to
  `model.generate(past_key_values=...)`).
- `statecache.integrations.fla`: flash-linear-attention's GatedDeltaNet and
  KDA models (`StatecacheFLACache`).

Both keep every linear-attention state in statecached's slots, driven
through `statecache.torch`'s stream-ordered ops on an attached pool
(`EnginePool`); the runtime keeps its convolution windows and, for hybrid
models, its attention KV. Multi-turn prefix reuse (`end_turn` / `begin_turn`)
snapshots a slot with the convolution windows as aux bytes and restores it
the next turn. `record_trajectories` / `calibrate` make a DAMP layout from the
runtime's own forward. The runtime-neutral half is `statecache.integrations._slots`.
"""
