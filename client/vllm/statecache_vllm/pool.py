"""One rank's recurrent-state storage for the plugin, in one of two kinds
(config key `storage`), both serving the same calls to the layers:

- PagePools ("pages", the default): statecache's ops run over the packed
  state area of vLLM's own KV-cache pages (statecache.torch.EnginePool.local,
  no server): one local pool per GDN state tensor (position), slot = vLLM
  block id, so the state memory is exactly what vLLM allocated and counted.
- PoolManager ("server"): the states live in a statecached pool (attached,
  or a spawned child): num_blocks - 1 attached slots and a block -> slot
  table; vLLM's packed-size pages stay unused.

    store = PagePools.open(cfg, geometry=geo, tensors=[t0, t1], device=dev)
    store = PoolManager.open(cfg, geometry=geo, layers=2, num_blocks=1024,
                             tp_size=1, rank=0, device=dev, environ=os.environ)
    pool, layer, record, rows = store.bind(position)   # what a layer calls with
    slots = store.lookup(block_ids)       # int32 pool indices, -1 = padding
    ... statecache_vllm.step.decode(pool, layer, slots, ..., record=record)
    store.check()                         # raises the first failed op
    store.close()

`rows` is the [slots, state bytes] view of vLLM's pages (PagePools), which
the layer zeroes for sequences that start from nothing (a page may hold
another group's bytes), or None (PoolManager: slots start at zero).

Ownership (PoolManager): the model and its slots belong to the manager for
its life; close() detaches, releases the slots and drops the model (so a
later open() of the same id registers it afresh); a spawned statecached is a
child process ended by close() (and by the kernel when this process dies: it
gets SIGTERM through PR_SET_PDEATHSIG). PagePools own nothing but their
handles: vLLM owns the memory.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence

import torch

import statecache as sc
import statecache.torch as sct
from statecache_vllm import slots as slotmap
from statecache_vllm.config import PluginConfig
from statecache_vllm.layout import RankGeometry, head_bytes

_PR_SET_PDEATHSIG = 1
# statecached's limit of slots per AllocateSlots call (StateCacheService
# Limits::max_allocate).
_ALLOCATE_CHUNK = 4096
# Checkpoint memory a spawned server keeps (the plugin takes no checkpoints).
_SPAWN_CHECKPOINT_BYTES = 1 << 20   # at least; RegisterModel reserves one checkpoint of a slot


class PoolError(RuntimeError):
    """The pool could not be set up; the message says which step and why."""


@dataclass(frozen=True)
class PoolShape:
    """What the pool holds: `layers` states of `geometry` per slot, `slots`
    slots of `slot_bytes` each."""
    geometry: RankGeometry
    layers: int
    slots: int
    head_bytes: int

    @property
    def slot_bytes(self) -> int:
        return self.layers * self.geometry.h_v * self.head_bytes

    @property
    def pool_bytes(self) -> int:
        return self.slots * self.slot_bytes


def _physical_device(device: torch.device, environ: Mapping[str, str]) -> Optional[str]:
    """CUDA_VISIBLE_DEVICES entry of `device` for a spawned server (None: CPU)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = environ.get("CUDA_VISIBLE_DEVICES", "")
    names = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    return names[index] if index < len(names) else str(index)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class SpawnedServer:
    """statecached as a child on a unix socket in a private temp folder."""

    def __init__(self, binary: str, *, backend: str, state_bytes: int, checkpoint_bytes: int = 0,
                 physical_device: Optional[str], extra_args: Sequence[str],
                 environ: Mapping[str, str], timeout_s: float = 60.0):
        self.dir = tempfile.mkdtemp(prefix="statecache-vllm-")
        self.sock = os.path.join(self.dir, "sc.sock")
        self.target = "unix:" + self.sock
        self.log_path = os.path.join(self.dir, "statecached.log")
        args = [binary, f"--listen={self.target}", f"--backend={backend}", "--dataplane",
                "--metrics_port=-1", f"--state_memory_bytes={state_bytes}",
                f"--checkpoint_memory_bytes={max(checkpoint_bytes, _SPAWN_CHECKPOINT_BYTES)}",
                "--slot_idle_timeout_ms=0"]
        if backend == "cpu":
            args.append("--shared_pools")
        args += list(extra_args)
        env = dict(environ)
        if physical_device is not None:
            env["CUDA_VISIBLE_DEVICES"] = physical_device
        self._log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                         env=env, preexec_fn=_die_with_parent)
        except OSError as e:
            self._log.close()
            raise PoolError(f"statecached: cannot start {binary!r}: {e}") from None
        deadline = time.time() + timeout_s
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.time() > deadline:
                tail = self.tail()
                self.stop()
                raise PoolError(f"statecached: did not start ({' '.join(args)}):\n{tail}")
            time.sleep(0.05)

    def tail(self, n: int = 20) -> str:
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class PoolManager:
    """A rank's pool (see the module comment). Build with open()."""

    def __init__(self, *, shape: PoolShape, model_id: str, client: "sc.Client",
                 handles: List["sc.SlotHandle"], pool: "sct.EnginePool", table: torch.Tensor,
                 record: torch.Tensor, server: Optional[SpawnedServer], check_every: int):
        self.shape = shape
        self.model_id = model_id
        self.client = client
        self.handles = handles
        self.pool = pool
        self.table = table      # int32 [num_blocks] on the pool's device; [0] = -1
        self.record = record    # uint8, the pool's device; one stream (vLLM's compute stream)
        self.server = server
        self.check_every = check_every
        self._steps = 0
        self._closed = False

    @classmethod
    def open(cls, cfg: PluginConfig, *, geometry: RankGeometry, layers: int, num_blocks: int,
             tp_size: int, rank: int, device: torch.device,
             environ: Mapping[str, str]) -> "PoolManager":
        """Attaches to cfg.target (or starts statecached), registers
        "<model_id>.tp<T>.r<R>" with `layers` GDN layers of `geometry`,
        allocates and attaches num_blocks - 1 slots. PoolError naming the
        step on any failure (nothing is left allocated)."""
        hb = head_bytes(cfg.format, geometry.d_k, geometry.d_v)
        shape = PoolShape(geometry, layers, slotmap.slots_needed(num_blocks), hb)
        model_id = cfg.rank_model_id(tp_size, rank)
        server = None
        if cfg.spawn:
            server = SpawnedServer(
                cfg.statecached, backend="cuda" if device.type == "cuda" else "cpu",
                state_bytes=shape.pool_bytes + (64 << 20), checkpoint_bytes=shape.slot_bytes,
                physical_device=_physical_device(device, environ), extra_args=cfg.spawn_args,
                environ=environ)
            target = server.target
        else:
            target = cfg.rank_target(rank)
        client = None
        registered = False
        handles: List[sc.SlotHandle] = []
        try:
            client = sc.Client(target, token=cfg.token or None, timeout=120)
            client.wait_ready(timeout=10)
            geo = sc.Geometry("gdn", layers=layers, h_qk=geometry.h_qk, h_v=geometry.h_v,
                              d_k=geometry.d_k, d_v=geometry.d_v)
            if cfg.drop_existing:
                try:
                    client.drop_model(model_id, force=True)
                except sc.NotFound:
                    pass
            info = client.register_model(model_id, geo, cfg.format.text, slots=shape.slots,
                                         checkpoints=1, layout_file=cfg.layout_file or None)
            registered = True
            if info.head_bytes.total != hb:
                raise PoolError(f"format: statecached packs a {geometry.d_k}x{geometry.d_v} "
                                f"'{cfg.format.text}' head in {info.head_bytes.total} bytes, the "
                                f"plugin sized vLLM's page for {hb} (statecache_vllm.layout)")
            while len(handles) < shape.slots:
                handles += client.allocate_slots(
                    model_id, min(_ALLOCATE_CHUNK, shape.slots - len(handles)))
            pool = sct.EnginePool(target, model_id, handles, token=cfg.token or None,
                                  lease_ms=cfg.lease_ms, library=cfg.library or None)
            if pool.device.type != device.type:
                raise PoolError(f"backend: statecached runs on {pool.device.type}, vLLM's "
                                f"layers on {device.type}")
            table = torch.full((num_blocks,), slotmap.PAD, dtype=torch.int32, device=pool.device)
            table[1:] = pool.slot_indices(handles)
            record = pool.new_record()
        except Exception as e:
            if client is not None:
                if registered:
                    _release(client, model_id, handles)
                client.close()
            if server is not None:
                server.stop()
            if isinstance(e, PoolError):
                raise
            raise PoolError(f"statecache pool for {model_id} at {target}: "
                            f"{type(e).__name__}: {e}") from e
        return cls(shape=shape, model_id=model_id, client=client, handles=handles, pool=pool,
                   table=table, record=record, server=server, check_every=cfg.check_every)

    def bind(self, position: int):
        """(pool, layer index in it, error record, rows or None) of the GDN
        layers at `position`: the shared pool, layer = position."""
        if not 0 <= position < self.shape.layers:
            raise PoolError(f"position: {position} outside the pool's {self.shape.layers} layers")
        return self.pool, position, self.record, None

    def lookup(self, block_ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _lookup(self.table, block_ids, out)

    def step(self, capturing: bool) -> None:
        _step(self, capturing)

    def check(self) -> None:
        self.pool.check(self.record)

    def close(self) -> None:
        """Detaches (the fence stops every later op or graph replay), releases
        the slots, stops a spawned server (once; later calls do nothing).
        Destroy captured graphs first."""
        if self._closed:
            return
        self._closed = True
        try:
            self.pool.close()
        finally:
            _release(self.client, self.model_id, self.handles)
            self.client.close()
            if self.server is not None:
                self.server.stop()


class PagePools:
    """The "pages" storage (see the module comment). Build with open()."""

    def __init__(self, *, shape: PoolShape, pools: List["sct.EnginePool"],
                 record: torch.Tensor, rows: List[torch.Tensor], table: torch.Tensor,
                 check_every: int):
        self.shape = shape
        self.pools = pools
        # One error record for every pool (vLLM's compute stream): a check is
        # one wait and one read however many positions there are. A failure
        # names the op, the block and the field; every pool has one layer, so
        # it names layer 0 whatever the position.
        self.record = record
        self.rows = rows         # [num_blocks, state bytes] views of vLLM's pages
        self.table = table       # int32 [num_blocks]: b -> b, the null block -> -1
        self.server = None
        self.check_every = check_every
        self._steps = 0
        self._closed = False

    @classmethod
    def open(cls, cfg: PluginConfig, *, geometry: RankGeometry, tensors: Sequence[torch.Tensor],
             device: torch.device) -> "PagePools":
        """One local pool of one layer per state tensor (position j =
        tensors[j]: uint8 [num_blocks, state bytes], rows inside vLLM's pages;
        with cfg.layout_file, layer j of that file). PoolError naming the
        tensor on any failure (nothing is left open)."""
        if not tensors:
            raise PoolError("tensors: no GDN state tensor")
        hb = head_bytes(cfg.format, geometry.d_k, geometry.d_v)
        num_blocks = tensors[0].shape[0]
        shape = PoolShape(geometry, len(tensors), num_blocks, hb)
        geo = sc.Geometry("gdn", layers=1, h_qk=geometry.h_qk, h_v=geometry.h_v,
                          d_k=geometry.d_k, d_v=geometry.d_v)
        pools: List[sct.EnginePool] = []
        try:
            for j, t in enumerate(tensors):
                if t.device != device:
                    raise PoolError(f"tensors[{j}]: on {t.device}, the layers run on {device}")
                if t.shape[0] != num_blocks:
                    raise PoolError(f"tensors[{j}]: {t.shape[0]} blocks, tensors[0] has "
                                    f"{num_blocks}")
                try:
                    pool = sct.EnginePool.local(
                        t, geo, cfg.format.text, layout_path=cfg.layout_file or None,
                        layout_layer=j if cfg.layout_file else None,
                        library=cfg.library or None)
                except sc.StateCacheError as e:
                    raise PoolError(f"tensors[{j}]: statecache cannot index vLLM's pages "
                                    f"(shape {tuple(t.shape)}, strides {t.stride()}): "
                                    f"{e}") from e
                pools.append(pool)
                if pool.num_slots != num_blocks:
                    raise PoolError(f"tensors[{j}]: {pool.num_slots} slots for {num_blocks} "
                                    "blocks")
                if pool.device.type != device.type:
                    raise PoolError(f"backend: statecache runs on {pool.device.type}, vLLM's "
                                    f"layers on {device.type}")
            record = pools[0].new_record()
            table = torch.arange(num_blocks, dtype=torch.int32, device=device)
            table[slotmap.NULL_BLOCK_ID] = slotmap.PAD
        except Exception:
            for pool in pools:
                pool.close()
            raise
        return cls(shape=shape, pools=pools, record=record,
                   rows=[t[:, :geometry.h_v * hb] for t in tensors], table=table,
                   check_every=cfg.check_every)

    def bind(self, position: int):
        """(pool, 0, the shared error record, its rows) of the GDN layers at
        `position`."""
        if not 0 <= position < len(self.pools):
            raise PoolError(f"position: {position} outside the {len(self.pools)} state tensors")
        return self.pools[position], 0, self.record, self.rows[position]

    def lookup(self, block_ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _lookup(self.table, block_ids, out)

    def step(self, capturing: bool) -> None:
        _step(self, capturing)

    def check(self) -> None:
        self.pools[0].check(self.record)

    def close(self) -> None:
        """Closes the pools; vLLM's pages are untouched. Destroy CUDA graphs
        that captured their ops first: local pools have no fence, and a
        replay after close would read the freed layout maps (vLLM drops its
        graphs before it rebinds the KV cache). Later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        for pool in self.pools:
            pool.close()


def _lookup(table: torch.Tensor, block_ids: torch.Tensor,
            out: Optional[torch.Tensor]) -> torch.Tensor:
    """Pool indices (int32) of vLLM block ids (any int dtype, on the table's
    device): the null block and negative ids give -1. A device gather
    (graph-capturable); `out` (int32, same length) receives it in place."""
    idx = block_ids.to(torch.int64).clamp(min=0)
    if out is None:
        return table.index_select(0, idx)
    return torch.index_select(table, 0, idx, out=out)


def _step(store, capturing: bool) -> None:
    """Called once per vLLM step (host): every check_every steps, waits for
    the stream and raises the first failed op (InvalidArgument naming op,
    layer, field). Never while a CUDA graph is being captured."""
    if capturing:
        return
    store._steps += 1
    if store._steps % store.check_every == 0:
        store.check()


def _release(client: "sc.Client", model_id: str, handles: Sequence["sc.SlotHandle"]) -> None:
    """Releases the slots and drops the model the manager registered (best
    effort: a server that is gone frees them itself)."""
    try:
        if handles:
            client.release_slots(model_id, handles)
        client.drop_model(model_id, force=True)
    except sc.StateCacheError:
        pass
