"""What each training worker reads, in a deterministic order, and how rows become batches.

Exact resumption (a relaunched run consumes exactly the examples an uninterrupted one would)
needs every worker's example stream to be a pure function of (seed, epoch, rank). Ray Data's
`streaming_split` hands blocks to whichever worker asks first, so instead each worker streams
its own files through its own Ray Data pipeline (`read_parquet`, order preserved):

- epoch e: the shard files are permuted with seed (seed, e) and dealt round-robin to ranks;
- every rank runs the same number of steps per epoch, the smallest number of full batches any
  rank has (the rest of the epoch's rows are dropped; the next epoch deals the files anew);
- masking is drawn per mention from (seed, epoch, context_id, the mention's index), `mask_draws`:
  20% of mentions, all their tokens replaced by [MASK], redrawn every epoch, independent of
  batch composition;
- resuming at (epoch, step) skips `step` batches of that epoch's stream.
Shards are the unit of assignment: build data with enough files per split (`eae data build
--shard-rows`) that each worker gets several.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from eae_data.constants import MASK_TOKEN_ID, NULL_ENTITY
from eae_data.shards import files_for_rank, rows_per_rank
from eae_model.mentions import Mentions
from eae_model.model import IGNORE, TargetIndices

EVAL_EPOCH = 2**31 - 1  # the masking seed's epoch for dev batches (seeds must be non-negative)
COLUMNS = ["context_id", "token_ids", "mention_starts", "mention_ends", "mention_entity_ids"]


def steps_per_epoch(files: list[str], seed: int, epoch: int, world_size: int, batch_size: int) -> int:
    """Full batches per rank in this epoch: the same for every rank (the smallest)."""
    return min(rows_per_rank(files, seed, epoch, world_size)) // batch_size


@dataclass
class Batch:
    context_ids: torch.Tensor  # [B]
    input_ids: torch.Tensor  # [B, L], masked
    attention_mask: torch.Tensor  # [B, L]
    mlm_labels: torch.Tensor  # [B, L], original token at masked positions, IGNORE elsewhere
    mentions: Mentions
    indices: TargetIndices  # masked positions and linked mentions, found on the host

    def _map(self, fn) -> "Batch":
        m = self.mentions
        return Batch(fn(self.context_ids), fn(self.input_ids), fn(self.attention_mask), fn(self.mlm_labels),
                     Mentions(fn(m.batch_ids), fn(m.starts), fn(m.ends), fn(m.entity_ids)), self.indices.map(fn))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """The same batch in page-locked host memory: its copy to a GPU with non_blocking=True
        is queued on the stream instead of making the host wait for the GPU's queue to drain
        (what a copy from pageable memory does)."""
        return self._map(torch.Tensor.pin_memory)

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


def mask_draws(seed: int, epoch: int, context_ids: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) draws, one per mention: a hash (splitmix64's mixer) of (seed, epoch,
    context id, the mention's index in its context). A pure function of those four, so a
    mention's mask does not depend on which batch or worker its context lands in, and computed
    for a whole batch in a few numpy operations (a generator per context cost ~10 ms of Python
    a batch, in a thread that shares the training step's interpreter lock)."""
    x = np.full(len(index), seed, dtype=np.uint64)
    for part in (np.uint64(epoch), np.asarray(context_ids, dtype=np.int64).astype(np.uint64),
                 np.asarray(index, dtype=np.uint64)):
        x = _mix(x + np.uint64(0x9E3779B97F4A7C15)) ^ part  # uint64 arithmetic wraps (mod 2^64)
    return (_mix(x) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _flat(column) -> tuple[np.ndarray, np.ndarray]:
    """A column of per-row integer lists (Ray Data's numpy batch: an object array of arrays,
    or a 2-D array when every row has the same length) -> (all values int64, row lengths)."""
    lengths = np.fromiter((len(x) for x in column), dtype=np.int64, count=len(column))
    if not len(column):
        return np.zeros(0, np.int64), lengths
    return np.concatenate(list(column)).astype(np.int64, copy=False), lengths


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """For groups of `lengths` items laid end to end: each item's position in its group."""
    return np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def collate(rows: dict[str, np.ndarray], seed: int, epoch: int, mask_rate: float, num_entities: int | None,
            pad_to: int | None = None, pad_multiple: int = 0) -> Batch:
    """Ray Data numpy batch (columns of per-row arrays) -> a padded, masked Batch.

    Entity ids >= num_entities (data built with a larger vocabulary than the model's table)
    become unlinked; None keeps them as they are. pad_to: every batch padded to this length
    (GPUs: one shape for every step; a new sequence length costs a new attention plan, ~1-2 s
    on an H100) instead of its longest context; pad_multiple: to its longest context rounded up
    to this multiple instead (at most pad_to), a few shapes for short contexts. Vectorised over
    the batch (no loop over rows): it runs in the prefetch thread, whose Python holds the
    interpreter lock the training step's kernel launches need (benchmarks/bench_collate.py)."""
    context_ids = np.asarray(rows["context_id"]).astype(np.int64)
    tokens, token_counts = _flat(rows["token_ids"])
    batch = len(token_counts)
    length = int(token_counts.max()) if batch else 0
    if pad_to is not None and length > pad_to:
        raise ValueError(f"a context of {length} tokens is longer than pad_to={pad_to}")
    if pad_multiple:
        length = -(-length // pad_multiple) * pad_multiple
        length = length if pad_to is None else min(length, pad_to)
    elif pad_to is not None:
        length = pad_to
    # every token's (row, column)
    token_row, token_col = np.repeat(np.arange(batch), token_counts), _offsets(token_counts)
    input_ids = np.zeros((batch, length), dtype=np.int64)
    attention = np.zeros((batch, length), dtype=np.int64)
    labels = np.full((batch, length), IGNORE, dtype=np.int64)
    input_ids[token_row, token_col] = tokens
    attention[token_row, token_col] = 1

    starts, counts = _flat(rows["mention_starts"])
    ends, _ = _flat(rows["mention_ends"])
    entity_ids, _ = _flat(rows["mention_entity_ids"])
    b_ids = np.repeat(np.arange(batch), counts)
    masked = mask_draws(seed, epoch, context_ids[b_ids], _offsets(counts)) < mask_rate  # index in its context
    if len(ends) == len(starts):
        # Only well-placed spans are masked; `validate` below names any other.
        masked &= (starts >= 0) & (starts <= ends) & (ends < token_counts[b_ids])
        span = ends[masked] - starts[masked] + 1
        rows_m = np.repeat(b_ids[masked], span)
        cols_m = np.repeat(starts[masked], span) + _offsets(span)
        labels[rows_m, cols_m] = input_ids[rows_m, cols_m]
        input_ids[rows_m, cols_m] = MASK_TOKEN_ID
    if num_entities is not None:
        entity_ids = np.where(entity_ids < num_entities, entity_ids, NULL_ENTITY)
    as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
    mentions = Mentions(as_t(b_ids), as_t(starts), as_t(ends), as_t(entity_ids))
    labels_t = as_t(labels)
    out = Batch(as_t(context_ids), as_t(input_ids), as_t(attention), labels_t, mentions,
                TargetIndices.of(labels_t, mentions))
    # The model's input checks and its indices, here on the host (in the prefetch thread): the
    # training step runs the model with validate=False and these indices, as on a GPU each check
    # and each nonzero made the host wait for the GPU.
    empty = token_counts == 0
    if empty.any():
        raise ValueError(f"context {int(context_ids[empty.argmax()])} has no tokens")
    mentions.validate(out.attention_mask, num_entities)
    return out


# Ray Data's Parquet datasource for `read_rows`: V1 (see there); True only to measure V2
# (benchmarks/bench_pipeline_start.py --datasources v2,v1).
USE_DATASOURCE_V2 = False


def read_rows(files: list[str], rows: int):
    """A Ray Data dataset of the first `rows` rows of `files` (COLUMNS), in file order.

    limit(): read no more than needed (stopping the iterator early instead would interrupt
    Ray Data's read tasks mid-flight). Parquet datasource V1: Ray 2.60's default V2 lists
    files with a pool of 32 footer-reading actors per pipeline (RAY_DATA_PARQUET_FOOTER_NUM_ACTORS),
    32 new processes at each epoch of each worker; on the 2-core CI machine a pipeline then
    took ~14 s to give its first batch against ~2.4 s with V1, and on the GPU machines the
    next epoch's start stalled the running steps (docs/performance.md)."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False  # one bar per worker per epoch would drown the step log
    ctx.use_datasource_v2 = USE_DATASOURCE_V2
    return ray.data.read_parquet(files, columns=COLUMNS, shuffle=None).limit(rows)


def cached_batches(files: list[str], rows: int, batch_size: int, cache: dict[str, dict[str, np.ndarray]],
                   order_seed: list[int] | None = None):
    """The batches `read_rows(files, rows).iter_batches(batch_size, drop_last=True)` gives (the
    same rows in the same order and numpy format), from `cache`: each file's columns, read with
    pyarrow the first time an epoch needs the file and kept for every later epoch.

    Why not Ray Data here: a worker's Ray Data pipeline starts anew every epoch (its files
    change with the epoch, `files_for_rank`), and a start took ~1-11 s before the first batch
    (docs/performance.md). On data that fits in memory an epoch can be a handful of steps (the
    regime study's 5k-entity world: 9 steps of 512 contexts), and start-ups would then take
    most of the run. `train.cache_data` chooses (default: when the training split is small).

    order_seed: the files' rows in a random order drawn from this seed (then the first `rows`),
    not file order (train.shuffle_rows): shards hold their articles' contexts in order, often
    one source to a shard, and a small batch read in file order trained on one source and one
    stretch of the alphabet for many steps (the loss rose at each shard boundary)."""
    for f in files:
        if f not in cache:
            table = pq.read_table(f, columns=COLUMNS)
            cache[f] = {c: table.column(c).to_numpy(zero_copy_only=False) for c in COLUMNS}
    columns = {c: np.concatenate([cache[f][c] for f in files]) for c in COLUMNS}
    pick = (np.random.default_rng(order_seed).permutation(len(columns[COLUMNS[0]]))[:rows] if order_seed is not None
            else slice(0, rows))
    columns = {c: v[pick] for c, v in columns.items()}
    for start in range(0, rows - batch_size + 1, batch_size):
        yield {c: v[start : start + batch_size] for c, v in columns.items()}


# train.cache_data's default: cache when the training split's Parquet files hold at most this
# many bytes (the 100k-entity world's: ~25 MB; each worker would hold them all, decoded)
CACHE_MAX_BYTES = 256 * 2**20


def cache_by_default(files: list[str]) -> bool:
    return sum(Path(f).stat().st_size for f in files) <= CACHE_MAX_BYTES


def caches(files: list[str], cache_data: bool | None) -> bool:
    """Whether the training split is kept in memory (train.cache_data; None: cache_by_default)."""
    return cache_by_default(files) if cache_data is None else cache_data


def iter_epoch(files, seed, epoch, rank, world_size, batch_size, mask_rate, num_entities, skip_steps=0, pad_to=None,
               cache: dict | None = None, shuffle: bool = False, pad_multiple: int = 0):
    """The rank's batches of one epoch (Ray Data streaming, order preserved; or from `cache`,
    `cached_batches`, with `shuffle` its rows in an order drawn from (seed, epoch, rank)), after
    skipping the first `skip_steps` (resumption: the same order again); stops at
    steps_per_epoch."""
    steps = steps_per_epoch(files, seed, epoch, world_size, batch_size)
    mine = files_for_rank(files, seed, epoch, rank, world_size)
    if steps <= skip_steps or not mine:  # nothing left (a checkpoint at the epoch's last step)
        return
    if cache is None:
        batches = read_rows(mine, steps * batch_size).iter_batches(batch_size=batch_size, batch_format="numpy",
                                                                   drop_last=True)
    else:
        batches = cached_batches(mine, steps * batch_size, batch_size, cache, [seed, epoch, rank] if shuffle else None)
    for step, rows in enumerate(batches):
        if step < skip_steps:
            continue
        yield step, collate(rows, seed, epoch, mask_rate, num_entities, pad_to, pad_multiple)


_DONE = object()


def prefetch(items: Iterator, depth: int, pin_for: torch.device | None = None) -> Iterator:
    """`items` in order, produced up to `depth` ahead by a background thread that starts now
    (not at the first next()), so that reading (Ray Data) and collating the next batches
    overlap the current training step. pin_for: a CUDA device; each (step, Batch) item's batch
    is put in page-locked memory by that thread, with that device current (Ray Train can show a
    worker every GPU of its node: the thread must not open a context on another worker's GPU).
    depth 0: no thread, the items as they come. An exception in the producer is raised by the
    consumer; closing the returned iterator (max_steps reached, or the epoch's last step taken)
    stops the producer."""
    if depth <= 0:
        return iter(items)
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            if pin_for is not None:
                torch.cuda.set_device(pin_for)
            for item in items:
                if pin_for is not None:
                    step, batch = item
                    item = (step, batch.pin_memory())
                if not put(item):
                    return
            put(_DONE)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, raised there
            put(error)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # the source generator (its Ray Data iterator) ends in this thread

    thread = threading.Thread(target=produce, name="eae-prefetch", daemon=True)
    thread.start()
    return _Prefetched(ready, stop)


class _Prefetched:
    """The consumer's end of `prefetch`: an iterator whose close() stops the producer, also
    before the first item was taken (a generator's close() would not run its cleanup then).
    The producer stops at its next put and closes its source itself: not waited for here (a
    Ray Data pipeline's teardown took seconds; the next epoch need not wait for it)."""

    def __init__(self, ready: queue.Queue, stop: threading.Event):
        self.ready, self.stop, self.done = ready, stop, False

    def __iter__(self) -> "_Prefetched":
        return self

    def __next__(self):
        if self.done:
            raise StopIteration
        item = self.ready.get()
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self) -> None:
        self.done = True
        self.stop.set()


# Steps before an epoch's end at which the next epoch's pipeline starts: a new Ray Data pipeline
# took ~11 s to deliver its first batch on the H100 machines (~100 steps of 0.1 s; datasource V2,
# before `read_rows`), and reads the worker's whole epoch in ~10 s on an H200 host.
NEXT_EPOCH_LEAD = 256


def iter_epochs(open_epoch: Callable[[int, int], Iterator], steps_in: Callable[[int], int], first_epoch: int,
                skip_steps: int = 0, lead: int = NEXT_EPOCH_LEAD) -> Iterator[tuple[int, int, object]]:
    """(epoch, step, batch) for epochs first_epoch, first_epoch + 1, ... without end, starting
    at step `skip_steps` of the first. open_epoch(epoch, skip) -> that epoch's (step, batch)
    stream, started at once (`prefetch`); steps_in(epoch) -> its number of steps. The next
    epoch's stream is opened `lead` steps before the current one ends, so that its start-up
    overlaps training instead of stalling it. Closing this generator closes both streams."""
    epoch, current, following = first_epoch, open_epoch(first_epoch, skip_steps), None
    try:
        while True:
            steps = steps_in(epoch)
            if steps == 0:
                raise ValueError(f"epoch {epoch} has no full batch for every worker: lower the batch size "
                                 "or build more data")
            for step, batch in current:
                if following is None and steps - (step + 1) <= lead:
                    following = open_epoch(epoch + 1, 0)
                yield epoch, step, batch
                if step + 1 >= steps:  # the epoch's last step: not waiting for its stream to end
                    break
            current.close()
            epoch += 1
            current, following = following if following is not None else open_epoch(epoch, 0), None
    finally:
        for stream in (current, following):
            close = getattr(stream, "close", None)
            if close is not None:
                close()


def iter_eval(files, seed, rank, world_size, batch_size, mask_rate, num_entities, max_batches=0, pad_to=None,
              pad_multiple=0):
    """Evaluation batches: every rank reads all (small) dev files in order and keeps every
    world_size-th row of each global batch, so all ranks run the same number of steps (the
    sharded table's collectives need every rank in every call). Masks are drawn as in
    training, with the epoch number EVAL_EPOCH: the same masks at every evaluation.

    A bounded evaluation (max_batches, train.eval_batches's default) reads its rows with pyarrow
    from the first files that hold them, in the worker: no Ray Data task, which needs a CPU of
    its own. A run whose workers took every CPU of the cluster (`train.cpus_per_worker=2` on a
    2-core machine) waited forever at its first evaluation for one. Unbounded, Ray Data streams
    the whole split."""
    counts = [pq.read_metadata(f).num_rows for f in files]
    rows = sum(counts)
    batch_size = min(batch_size, rows // world_size)  # a dev split smaller than a batch: one smaller batch
    if batch_size == 0:
        return
    steps = rows // (batch_size * world_size)
    if max_batches:
        steps = min(steps, max_batches)
    need, width = steps * batch_size * world_size, batch_size * world_size
    if max_batches:
        held = np.cumsum(counts)
        batches = cached_batches(files[: int(np.searchsorted(held, need)) + 1], need, width, {})
    else:
        batches = read_rows(files, need).iter_batches(batch_size=width, batch_format="numpy", drop_last=True)
    for rows in batches:
        yield collate({k: v[rank::world_size] for k, v in rows.items()}, seed, EVAL_EPOCH, mask_rate, num_entities, pad_to,
                      pad_multiple)


class DevBatches:
    """The evaluation's batches, read (`read()`: `iter_eval`) at the first evaluation and kept
    in host memory when `keep` (a bounded number of batches, train.eval_batches > 0): every
    evaluation reads the same rows with the same masks, and each one opened a new Ray Data
    pipeline (~6.5 s on the 2-core CI machine; the job evaluates at every checkpoint). An
    evaluation that stops early keeps nothing; the next one reads again."""

    def __init__(self, read: Callable[[], Iterator], keep: bool):
        self._read, self._keep = read, keep
        self._kept: list | None = None

    def __iter__(self) -> Iterator:
        return iter(self._kept) if self._kept is not None else self._first()

    def _first(self) -> Iterator:
        kept = []
        for batch in self._read():
            if self._keep:
                kept.append(batch)
            yield batch
        if self._keep:
            self._kept = kept
