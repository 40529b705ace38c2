"""The pretraining loop's data path: batch prefetching (`data.prefetch`: order, errors, early
stops and reading ahead, in threads), collation, epochs, dev batches and the Ray Data read
(`read_rows`, on the session's Ray cluster); the whole loop with prefetching runs in
test_pretrain.py (exact resumption after a kill)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from eae_platform.pretrain import data


class Source:
    """A generator of 0..n-1 that records how many items were produced and whether it was closed."""

    def __init__(self, n: int, fail_at: int | None = None):
        self.n, self.fail_at = n, fail_at
        self.produced = 0
        self.closed = False
        self.more = threading.Condition()

    def __iter__(self):
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise RuntimeError(f"unreadable shard at item {i}")
                with self.more:
                    self.produced += 1
                    self.more.notify_all()
                yield i
        finally:
            self.closed = True

    def wait_produced(self, count: int, timeout: float = 10.0) -> bool:
        with self.more:
            return self.more.wait_for(lambda: self.produced >= count, timeout)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetch_yields_every_item_in_order(depth):
    assert list(data.prefetch(iter(Source(25)), depth)) == list(range(25))


def test_prefetch_reads_ahead_up_to_its_depth():
    source = Source(100)
    stream = data.prefetch(iter(source), depth=3)
    assert next(stream) == 0
    # while the consumer holds item 0 (its training step), the thread fills the queue: items
    # 1-3 wait in it and item 4 is produced and held until there is room
    assert source.wait_produced(5)
    assert not source.wait_produced(6, timeout=0.5)
    assert next(stream) == 1
    assert source.wait_produced(6)
    stream.close()


def test_producer_errors_reach_the_consumer():
    stream = data.prefetch(iter(Source(10, fail_at=4)), depth=2)
    assert [next(stream) for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="unreadable shard at item 4"):
        next(stream)


def _prefetch_and_its_thread(source):
    """data.prefetch over `source` and the producer thread it started (other tests' producers
    may still be ending: they stop asynchronously)."""
    before = set(threading.enumerate())
    stream = data.prefetch(iter(source), depth=2)
    (thread,) = [t for t in threading.enumerate() if t.name == "eae-prefetch" and t not in before]
    return stream, thread


def test_closing_early_stops_the_thread_and_closes_the_source():
    source = Source(1000)
    stream, thread = _prefetch_and_its_thread(source)
    assert next(stream) == 0
    stream.close()
    thread.join(timeout=10)  # the producer stops at its next put, closing the source
    assert not thread.is_alive() and source.closed
    assert source.produced < 10


def _rows():
    import numpy as np

    obj = lambda *xs: np.array([np.array(x, dtype=np.int64) for x in xs], dtype=object)  # noqa: E731
    return {"context_id": np.array([7, 8]), "token_ids": obj([101, 5, 6, 7, 102], [101, 9, 102]),
            "mention_starts": obj([1], [1]), "mention_ends": obj([2], [1]), "mention_entity_ids": obj([3], [-1])}


def test_collate_pads_to_a_fixed_length_with_the_same_content():
    import torch

    natural = data.collate(_rows(), seed=0, epoch=0, mask_rate=0.5, num_entities=None)
    fixed = data.collate(_rows(), seed=0, epoch=0, mask_rate=0.5, num_entities=None, pad_to=16)
    assert natural.input_ids.shape == (2, 5) and fixed.input_ids.shape == (2, 16)
    for name in ("input_ids", "attention_mask", "mlm_labels"):
        a, b = getattr(natural, name), getattr(fixed, name)
        assert torch.equal(b[:, :5], a), name
    assert fixed.attention_mask[:, 5:].sum() == 0 and (fixed.mlm_labels[:, 5:] == natural.mlm_labels[1, 4]).all()
    assert torch.equal(fixed.mentions.starts, natural.mentions.starts)
    # the model's indices, found on the host: masked positions and linked mentions
    rows, cols = fixed.indices.mlm_positions
    assert torch.equal(fixed.mlm_labels[rows, cols], fixed.mlm_labels[fixed.mlm_labels != -100])
    assert len(rows) == int((fixed.mlm_labels != -100).sum()) and torch.equal(fixed.indices.linked, torch.tensor([0]))
    with pytest.raises(ValueError, match="longer than pad_to=4"):
        data.collate(_rows(), seed=0, epoch=0, mask_rate=0.5, num_entities=None, pad_to=4)


def _random_rows(n: int, seed: int = 0):
    """n contexts of 3-40 tokens with up to 6 non-overlapping mentions each (some contexts
    without any), as Ray Data's numpy batches hold them: object arrays of int32 arrays."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens, starts, ends, entities = [], [], [], []
    for _ in range(n):
        length = int(rng.integers(3, 40))
        tokens.append(rng.integers(1000, 2000, length).astype(np.int32))
        cuts = np.sort(rng.choice(np.arange(1, length - 1), size=min(int(rng.integers(0, 7)) * 2, (length - 2) // 2 * 2),
                                  replace=False))
        starts.append(cuts[0::2].astype(np.int32))
        ends.append(cuts[1::2].astype(np.int32))
        entities.append(rng.integers(-1, 50, len(cuts) // 2).astype(np.int32))
    obj = lambda xs: np.array(xs + [None], dtype=object)[:-1]  # noqa: E731
    return {"context_id": rng.permutation(10 * n)[:n], "token_ids": obj(tokens), "mention_starts": obj(starts),
            "mention_ends": obj(ends), "mention_entity_ids": obj(entities)}


def test_pad_multiple_pads_each_batch_to_its_longest_rounded_up_and_the_model_reads_it_the_same():
    """train.pad_multiple: each batch as long as its longest context rounded up to the multiple,
    at most pad_to (model.max_length), with the content of a batch padded to max_length; and the
    model's losses on both batches the same (padding is masked out of attention, and the heads
    read only real positions), so a run with it trains the same model on fewer padded tokens."""
    import torch

    from eae_model.config import load_config
    from eae_model.model import EaEModel

    rows = _random_rows(16, seed=1)
    longest = max(len(t) for t in rows["token_ids"])  # 3-39 tokens
    fixed = data.collate(rows, seed=0, epoch=0, mask_rate=0.5, num_entities=40, pad_to=64)
    rounded = data.collate(rows, seed=0, epoch=0, mask_rate=0.5, num_entities=40, pad_to=64, pad_multiple=16)
    capped = data.collate(rows, seed=0, epoch=0, mask_rate=0.5, num_entities=40, pad_to=longest, pad_multiple=16)
    assert rounded.input_ids.shape[1] == -(-longest // 16) * 16 < 64 and capped.input_ids.shape[1] == longest
    n = rounded.input_ids.shape[1]
    for name in ("input_ids", "attention_mask", "mlm_labels"):
        assert torch.equal(getattr(rounded, name), getattr(fixed, name)[:, :n]), name
    assert fixed.attention_mask[:, n:].sum() == 0
    with pytest.raises(ValueError, match=f"longer than pad_to={longest - 1}"):
        data.collate(rows, seed=0, epoch=0, mask_rate=0.5, num_entities=40, pad_to=longest - 1, pad_multiple=16)

    torch.manual_seed(0)
    model = EaEModel(load_config("tiny", overrides=["max_length=64", "num_entities=40"])).eval()
    with torch.no_grad():
        a, b = (model(x.input_ids, x.attention_mask, mentions=x.mentions, mlm_labels=x.mlm_labels, indices=x.indices)
                for x in (fixed, rounded))
    assert a.losses.keys() == b.losses.keys() and len(a.losses) >= 3
    for head in a.losses:
        torch.testing.assert_close(a.losses[head], b.losses[head], rtol=1e-5, atol=1e-5, msg=head)


def test_collate_equals_a_row_by_row_reference():
    """The vectorised collate against the obvious loop over rows, with the same draws."""
    import numpy as np
    import torch

    rows = _random_rows(64)
    batch = data.collate(rows, seed=3, epoch=1, mask_rate=0.3, num_entities=40, pad_to=48)
    input_ids = np.zeros((64, 48), np.int64)
    labels = np.full((64, 48), -100, np.int64)
    b_ids, entity_ids = [], []
    for b, ids in enumerate(rows["token_ids"]):
        input_ids[b, : len(ids)] = ids
        s, t, e = rows["mention_starts"][b], rows["mention_ends"][b], rows["mention_entity_ids"][b]
        draws = data.mask_draws(3, 1, np.full(len(s), rows["context_id"][b]), np.arange(len(s)))
        for start, end in zip(s[draws < 0.3], t[draws < 0.3]):
            labels[b, start : end + 1] = input_ids[b, start : end + 1]
            input_ids[b, start : end + 1] = 103  # [MASK]
        b_ids += [b] * len(s)
        entity_ids += [x if x < 40 else -1 for x in e]
    assert torch.equal(batch.input_ids, torch.from_numpy(input_ids))
    assert torch.equal(batch.mlm_labels, torch.from_numpy(labels))
    assert batch.attention_mask.sum(1).tolist() == [len(t) for t in rows["token_ids"]]
    assert batch.mentions.batch_ids.tolist() == b_ids and batch.mentions.entity_ids.tolist() == entity_ids
    assert batch.mentions.starts.tolist() == np.concatenate(list(rows["mention_starts"])).tolist()
    assert 0.2 < (labels != -100).any(1).mean() and (input_ids == 103).sum() == (labels != -100).sum()


def test_masks_follow_the_context_and_epoch_not_the_batch():
    """A context gets the same masks whichever contexts share its batch (exact resumption
    and any number of workers), new ones each epoch, and about mask_rate of its mentions."""
    import numpy as np

    rows = _random_rows(400, seed=1)
    whole = data.collate(rows, seed=0, epoch=0, mask_rate=0.2, num_entities=None)
    tail = data.collate({k: v[300:] for k, v in rows.items()}, seed=0, epoch=0, mask_rate=0.2, num_entities=None)
    length = tail.mlm_labels.shape[1]
    assert (whole.mlm_labels[300:, length:] == -100).all()
    assert whole.mlm_labels[300:, :length].equal(tail.mlm_labels)
    draws = data.mask_draws(0, 0, whole.context_ids[whole.mentions.batch_ids].numpy(),
                            np.concatenate([np.arange(len(s)) for s in rows["mention_starts"]]))
    masked = whole.mlm_labels[whole.mentions.batch_ids, whole.mentions.starts] != -100
    assert masked.numpy().tolist() == (draws < 0.2).tolist()
    assert 0.17 < masked.float().mean() < 0.23, float(masked.float().mean())  # ~1,200 mentions
    other_epoch = data.collate(rows, seed=0, epoch=1, mask_rate=0.2, num_entities=None)
    assert not other_epoch.mlm_labels.equal(whole.mlm_labels)


def test_collate_checks_the_models_inputs_on_the_host():
    """The loop runs the model with validate=False: collate must raise the model's errors."""
    import numpy as np

    from eae_model.mentions import MentionError

    rows = _rows()
    rows["mention_ends"][1] = np.array([5], dtype=np.int64)  # past context 8's 3 tokens
    with pytest.raises(MentionError, match="past the 3 real tokens of context 1"):
        data.collate(rows, seed=0, epoch=0, mask_rate=0.0, num_entities=None, pad_to=16)
    rows = _rows()
    rows["mention_entity_ids"][0] = np.array([-5], dtype=np.int64)
    with pytest.raises(MentionError, match="entity id -5"):
        data.collate(rows, seed=0, epoch=0, mask_rate=0.0, num_entities=10)
    obj = lambda *xs: np.array([np.array(x, dtype=np.int64) for x in xs] + [None], dtype=object)[:-1]  # noqa: E731
    rows = {"context_id": np.array([7, 8]), "token_ids": obj([101, 5, 102], []), "mention_starts": obj([1], []),
            "mention_ends": obj([1], []), "mention_entity_ids": obj([3], [])}
    with pytest.raises(ValueError, match="context 8 has no tokens"):
        data.collate(rows, seed=0, epoch=0, mask_rate=0.0, num_entities=None)


@pytest.mark.parametrize("use_gpu,fixed,multiple,expected", [(True, None, 0, 128), (False, None, 0, None),
                                                             (False, True, 0, 128), (True, False, 0, None),
                                                             (False, None, 16, 128)])
def test_batches_are_padded_to_max_length_on_gpus_by_default(use_gpu, fixed, multiple, expected):
    """pad_to: the fixed length, or with train.pad_multiple (on CPUs too) the most a batch is
    padded to: a rounded-up length never past the position embeddings."""
    from eae_platform.pretrain.config import load_pretrain_config
    from eae_platform.pretrain.loop import pad_to

    config = load_pretrain_config(preset="tiny", overrides=[
        "model.max_length=128", f"train.use_gpu={str(use_gpu).lower()}", f"train.pad_multiple={multiple}",
        f"train.pad_to_max_length={'null' if fixed is None else str(fixed).lower()}"])
    assert pad_to(config) == expected


def test_a_negative_pad_multiple_is_refused():
    from eae_platform.pretrain.config import load_pretrain_config

    with pytest.raises(ValueError, match="pad_multiple must be >= 0"):
        load_pretrain_config(preset="tiny", overrides=["train.pad_multiple=-16"])


def test_step_profiler_writes_the_profiled_steps_summary(tmp_path):
    import torch

    from eae_platform.pretrain.config import parse_steps
    from eae_platform.pretrain.profiling import StepProfiler

    out = tmp_path / "profile-rank0.txt"
    profiler = StepProfiler(parse_steps("2-3"), out, torch.device("cpu"))
    x = torch.randn(64, 64)
    for step in range(1, 6):
        profiler.before(step)
        x = (x @ x).tanh()
        profiler.after(step)
        assert out.is_file() == (step >= 3)
    text = out.read_text()
    assert text.startswith("steps 2-3: wall ") and "aten::mm" in text


def test_gc_timer_counts_the_collections_of_every_thread():
    import gc

    from eae_platform.pretrain.profiling import GcTimer

    def cycles(n: int) -> None:  # garbage that only a collection frees
        for _ in range(n):
            a = []
            a.append(a)

    timer = GcTimer()
    try:
        assert timer.take() == 0.0
        thread = threading.Thread(target=cycles, args=(200_000,))  # automatic collections, in another thread
        thread.start()
        thread.join()
        gc.collect()
        first = timer.take()
        assert first > 0 and timer.take() == 0.0
        start = time.perf_counter()
        gc.collect()
        assert 0 < timer.take() <= time.perf_counter() - start
    finally:
        timer.close()
    assert timer._time not in gc.callbacks
    gc.collect()
    assert timer.take() == 0.0


def test_gpu_lag_is_when_the_gpu_finished_a_step_after_the_host_launched_it():
    import torch

    from eae_platform.pretrain.profiling import GpuLag, gpu_lags

    # launches ended at host times 1.0, 1.1, 1.2; on the GPU the steps ended 0.25 and 0.1 s
    # before the last one, which ended at host time 1.5: lags 0.25, 0.3, 0.3
    assert gpu_lags([1.0, 1.1, 1.2], [0.25, 0.1, 0.0], 1.5) == pytest.approx([0.25, 0.3, 0.3])
    # a host-bound run: each step ends on the GPU just after its launches
    assert gpu_lags([1.0, 2.0], [1.0, 0.0], 2.001) == pytest.approx([0.001, 0.001])
    lag = GpuLag(torch.device("cpu"))  # no GPU: nothing to measure
    lag.mark()
    assert lag.take() is None


def test_span_timer_sums_each_name_until_taken():
    import torch

    from eae_platform.pretrain.profiling import SpanTimer, span

    timer = SpanTimer(torch.device("cpu"))
    start = time.perf_counter()
    for _ in range(3):
        with timer.span("exchange"):
            time.sleep(0.01)
    with span(timer, "grad_sync_wait"):
        pass
    with span(None, "grad_sync_wait"):  # no timer: nothing timed
        time.sleep(0.01)
    assert dict(timer.counts) == {"exchange": 3, "grad_sync_wait": 1}
    taken = timer.take()
    assert 0.03 <= taken["exchange"] <= time.perf_counter() - start and 0 <= taken["grad_sync_wait"] < 0.01
    assert timer.take() == {} and not timer.counts


def test_busy_time_is_the_union_of_overlapping_kernels_and_lists_the_gaps():
    from eae_platform.pretrain.profiling import busy_time

    # two streams: a overlaps b; c lies inside b; d starts after a 5-unit gap, e after 2 more
    spans = [(10, 20, "d"), (0, 4, "a"), (2, 5, "b"), (3, 4, "c"), (22, 23, "e")]
    busy, gaps = busy_time(spans)
    assert busy == 5 + 10 + 1
    assert gaps == [(5, "b", "d"), (2, "d", "e")]
    assert busy_time([]) == (0.0, [])


@pytest.mark.parametrize("text", ["3", "0-2", "5-4", "a-b", "2:3"])
def test_bad_profile_steps_are_a_clear_error(text):
    from eae_platform.pretrain.config import load_pretrain_config

    with pytest.raises(ValueError, match="profile_steps"):
        load_pretrain_config(preset="tiny", overrides=[f"train.profile_steps='{text}'"])


class Epochs:
    """Fake epoch streams for iter_epochs: epoch e has steps[e] steps; records when each was opened."""

    def __init__(self, steps: dict[int, int]):
        self.steps, self.opened, self.sources, self.consumed = steps, [], [], 0

    def open(self, epoch: int, skip: int):
        self.opened.append((epoch, skip, self.consumed))
        source = Source(self.steps[epoch])
        self.sources.append(source)
        return data.prefetch(((s, f"e{epoch}s{s}") for s in iter(source) if s >= skip), depth=2)


def test_epochs_run_on_in_order_and_the_next_one_opens_early():
    fake = Epochs({3: 10, 4: 6, 5: 8})
    out = []
    stream = data.iter_epochs(fake.open, fake.steps.__getitem__, first_epoch=3, skip_steps=2, lead=3)
    for epoch, step, batch in stream:
        out.append(batch)
        fake.consumed += 1
        if len(out) == 8 + 6 + 2:
            break
    stream.close()
    assert out == [f"e3s{s}" for s in range(2, 10)] + [f"e4s{s}" for s in range(6)] + ["e5s0", "e5s1"]
    # epoch 4 opened when 3 steps of epoch 3 were left (after its step 6, the 5th consumed),
    # epoch 5 when epoch 4 had 3 left; both before they were needed
    assert fake.opened == [(3, 2, 0), (4, 0, 4), (5, 0, 10)]
    deadline = time.time() + 10  # each producer closes its source as it stops
    while time.time() < deadline and not all(s.closed for s in fake.sources):
        time.sleep(0.01)
    assert all(s.closed for s in fake.sources)


def test_an_epoch_without_steps_is_a_clear_error():
    fake = Epochs({0: 2, 1: 0})
    with pytest.raises(ValueError, match="epoch 1 has no full batch"):
        list(data.iter_epochs(fake.open, fake.steps.__getitem__, first_epoch=0))


def test_closing_before_the_first_item_stops_the_thread_too():
    # iter_epochs opens the next epoch's stream ahead and may close it unread (max_steps)
    source = Source(1000)
    stream, thread = _prefetch_and_its_thread(source)
    assert source.wait_produced(3)
    stream.close()
    thread.join(timeout=10)
    assert not thread.is_alive() and source.closed and source.produced < 10


def test_dev_batches_are_read_once_when_bounded():
    """The evaluation's batches are read at the first evaluation and replayed after it (a new
    Ray Data pipeline per evaluation cost seconds); unbounded (eval_batches=0) they are read
    each time, and an evaluation stopped early keeps nothing."""
    reads = []

    def read():
        reads.append(1)
        yield from ("b0", "b1", "b2")

    dev = data.DevBatches(read, keep=True)
    assert next(iter(dev)) == "b0"  # stopped after one batch: nothing kept
    assert list(dev) == ["b0", "b1", "b2"] and len(reads) == 2
    assert list(dev) == ["b0", "b1", "b2"] and list(dev) == ["b0", "b1", "b2"] and len(reads) == 2
    streamed = data.DevBatches(read, keep=False)
    assert list(streamed) == list(streamed) == ["b0", "b1", "b2"] and len(reads) == 4


def test_with_table_counts_yields_its_steps_then_closes_its_source():
    """The loop's lookahead makes exactly one count exchange per step it will take (a worker
    exchanging for a step the others never take would wait forever) and then ends the epochs'
    pipelines."""
    from eae_platform.pretrain.loop import with_table_counts

    closed = []

    def epochs():
        try:
            for step in range(10):
                yield 0, step, f"batch {step}"
        finally:
            closed.append(True)

    items = list(with_table_counts(epochs(), model=None, group=None, steps=3))
    assert items == [(0, s, f"batch {s}", None) for s in range(3)] and closed == [True]


def test_read_rows_reads_the_first_rows_in_file_order_without_footer_actors(ray_cluster, tmp_path):
    """`read_rows`: the first rows of the files in the order given, through Parquet datasource
    V1 (V2's listing starts 32 footer-reading actors per pipeline: ~14 s a pipeline on 2 cores)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = []
    for f, ids in enumerate([range(20, 30), range(0, 10), range(10, 20)]):
        table = pa.table({"context_id": list(ids), "token_ids": [[101, i, 102] for i in ids],
                          "mention_starts": [[1]] * 10, "mention_ends": [[1]] * 10, "mention_entity_ids": [[i] for i in ids],
                          "text": ["unread"] * 10})
        files.append(str(tmp_path / f"part-{f}.parquet"))
        pq.write_table(table, files[-1])
    dataset = data.read_rows(files, 25)
    batches = list(dataset.iter_batches(batch_size=10, batch_format="numpy"))
    assert [int(i) for b in batches for i in b["context_id"]] == [*range(20, 30), *range(0, 15)]
    assert sorted(batches[0]) == sorted(data.COLUMNS)
    stats = dataset.stats()
    assert "ReadParquet" in stats and "ListFiles" not in stats, stats


def test_collective_timeline_lists_the_nccl_kernels_in_order_with_their_durations():
    from eae_platform.pretrain.profiling import collective_timeline

    # µs, as torch.profiler's time ranges: two exchanges on the NCCL stream, compute around them
    spans = [(1000, 1500, "gemm"), (1600, 2100, "ncclDevKernel_SendRecv(args)"), (1500, 1550, "ampere_sgemm"),
             (1200, 1300, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(args)")]
    assert collective_timeline(spans) == ["      0.200   0.100  ncclDevKernel_AllReduce_Sum_f32_RING_LL(args)",
                                          "      0.600   0.500  ncclDevKernel_SendRecv(args)"]
    assert collective_timeline([(0, 5, "gemm")]) == [] and collective_timeline([]) == []
    assert len(collective_timeline([(i, i + 1, "ncclDevKernel_SendRecv") for i in range(300)], limit=200)) == 200


def test_cached_epochs_give_the_batches_ray_data_gives_and_read_each_file_once(ray_cluster, tmp_path):
    """train.cache_data: the cached path (`cached_batches`) gives every epoch exactly the
    batches of the Ray Data path (same rows, order, masks); after the epoch that read a file,
    later epochs take its rows from memory (here: the files are rewritten with other context
    ids, and the cached epochs still give the first ones)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    def write(offset):
        files = []
        for f in range(3):
            ids = range(10 * f, 10 * f + 10)
            table = pa.table({"context_id": [offset + i for i in ids],
                              "token_ids": [[101, *range(1000, 1000 + 2 + i % 4), 102] for i in ids],
                              "mention_starts": [[1]] * 10, "mention_ends": [[2]] * 10,
                              "mention_entity_ids": [[i % 7] for i in ids]})
            files.append(str(tmp_path / f"part-{f}.parquet"))
            pq.write_table(table, files[-1])
        return files

    files = write(0)

    def epoch(e, cache):
        return [b for _, b in data.iter_epoch(files, 3, e, 0, 1, 4, 0.5, 7, cache=cache)]

    cache: dict = {}
    for e in (0, 1):
        streamed, cached = epoch(e, None), epoch(e, cache)
        assert len(streamed) == len(cached) == 7  # 30 rows, 4 a batch: the last 2 dropped
        for a, b in zip(streamed, cached):
            assert torch.equal(a.context_ids, b.context_ids) and torch.equal(a.input_ids, b.input_ids)
            assert torch.equal(a.mlm_labels, b.mlm_labels) and torch.equal(a.mentions.entity_ids, b.mentions.entity_ids)
    assert sorted(cache) == sorted(files)
    write(1000)
    assert max(int(b.context_ids.max()) for b in epoch(2, None)) >= 1000  # what the files hold now
    assert max(int(b.context_ids.max()) for b in epoch(2, cache)) < 30  # what the cache read before


def test_a_bounded_evaluation_reads_its_rows_without_ray_data(ray_cluster, tmp_path):
    """iter_eval with max_batches (train.eval_batches's default) gives the batches of the Ray
    Data path (same rows, order, masks, each rank its share), read with pyarrow in the process:
    no Ray Data task, which needs a CPU of its own and waited forever when the workers held
    every CPU of the cluster (train.cpus_per_worker=2 on 2 cores). A process without Ray reads
    them and Ray is still not started."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    files = []
    for f in range(3):
        ids = range(10 * f, 10 * f + 10)
        table = pa.table({"context_id": list(ids), "token_ids": [[101, *range(1000, 1002 + i % 4), 102] for i in ids],
                          "mention_starts": [[1]] * 10, "mention_ends": [[2]] * 10,
                          "mention_entity_ids": [[i % 7] for i in ids]})
        files.append(str(tmp_path / f"part-{f}.parquet"))
        pq.write_table(table, files[-1])
    for rank in (0, 1):  # 2 ranks x 4 rows a batch: the first 2 batches are rows 0-15
        streamed = list(data.iter_eval(files, 3, rank, 2, 4, 0.5, 7))[:2]  # unbounded: Ray Data
        bounded = list(data.iter_eval(files, 3, rank, 2, 4, 0.5, 7, max_batches=2))
        assert len(bounded) == 2
        for a, b in zip(streamed, bounded):
            assert torch.equal(a.context_ids, b.context_ids) and torch.equal(a.input_ids, b.input_ids)
            assert torch.equal(a.mlm_labels, b.mlm_labels) and torch.equal(a.mentions.entity_ids, b.mentions.entity_ids)
    code = ("import ray; from eae_platform.pretrain import data; "
            f"b = list(data.iter_eval({files!r}, 3, 0, 2, 4, 0.5, 7, max_batches=2)); "
            "print([int(i) for x in b for i in x.context_ids], ray.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.stdout.strip() == "[0, 2, 4, 6, 8, 10, 12, 14] False", out.stdout + out.stderr


def test_workers_holding_every_cpu_while_ray_data_has_tasks_are_warned_about(tmp_path):
    """ray_data_cpu_note: a warning when the workers would take every CPU and Ray Data still
    reads (training data streamed, or an unbounded evaluation); none with a CPU left, or when
    nothing is read through Ray Data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eae_platform.pretrain.checks import ray_data_cpu_note
    from eae_platform.pretrain.config import load_pretrain_config

    (tmp_path / "shards" / "train").mkdir(parents=True)
    pq.write_table(pa.table({"context_id": [1], "token_ids": [[101, 7, 102]]}), tmp_path / "shards" / "train" / "part-0.parquet")

    def note(cpus, *overrides):
        config = load_pretrain_config(preset="tiny", overrides=[f"train.data={tmp_path}", "train.cpus_per_worker=2", *overrides])
        return ray_data_cpu_note(config, cpus)

    assert note(2) is None  # a small split is cached and the evaluation is bounded: nothing for Ray Data
    streamed = note(2, "train.cache_data=false")
    assert streamed.startswith("warning: 1 worker(s) x train.cpus_per_worker=2 take 2 of the cluster's 2 CPUs") \
        and "training data streamed from Parquet" in streamed, streamed
    assert "train.eval_batches=0" in note(2.5, "train.eval_batches=0")
    assert note(3, "train.cache_data=false") is None and note(3, "train.eval_batches=0") is None


def test_workers_asking_for_more_gpus_than_the_cluster_has_are_warned_about():
    """gpu_note: train.use_gpu with fewer GPUs in the cluster than the workers ask (a GPU config
    on a laptop: Ray Train would wait without a word) gets a warning naming the fix; none on
    CPUs, or when the GPUs are there (fractions summed over workers). gpu_wait_note: the same
    for the Ray task of `eae finetune` and `eae eval` (--gpus)."""
    from eae_platform.pretrain.checks import gpu_note, gpu_wait_note
    from eae_platform.pretrain.config import load_pretrain_config

    def note(gpus, *overrides):
        return gpu_note(load_pretrain_config(preset="tiny", overrides=list(overrides)), gpus)

    on_cpu = note(0, "train.use_gpu=true")
    assert on_cpu.startswith("warning: 1 worker(s) x train.gpus_per_worker=1 need 1 GPU(s) and this Ray cluster has 0") \
        and "--set train.use_gpu=false" in on_cpu, on_cpu
    assert note(0) is None and note(1, "train.use_gpu=true") is None
    assert "need 2 GPU(s) and this Ray cluster has 1" in note(1, "train.use_gpu=true", "train.num_workers=2")
    assert note(1, "train.use_gpu=true", "train.num_workers=4", "train.gpus_per_worker=0.25") is None
    # the same for a Ray task's GPUs (eae finetune / eval --gpus)
    assert gpu_wait_note("--gpus 1", 1, 0, "--gpus 0") == (
        "warning: --gpus 1 need 1 GPU(s) and this Ray cluster has 0: the run waits until nodes with GPUs join. "
        "Without a GPU, run with --gpus 0 (Ctrl-C stops this one).")
    assert gpu_wait_note("--gpus 0", 0, 0, "--gpus 0") is None


def test_shuffled_epochs_mix_the_shards_rows_in_a_seeded_order(tmp_path):
    """train.shuffle_rows (the cached path): an epoch's batches hold the rows of file order in an
    order drawn from (seed, epoch, rank): the same rows, the same order again for a relaunch
    (resumption skips into it), another order next epoch, and batches that mix the shards
    (in file order the first batches came from the first shard alone)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = []
    for f in range(3):
        ids = range(100 * f, 100 * f + 10)
        table = pa.table({"context_id": list(ids), "token_ids": [[101, 1000 + i % 5, 102] for i in ids],
                          "mention_starts": [[1]] * 10, "mention_ends": [[1]] * 10, "mention_entity_ids": [[i % 7] for i in ids]})
        files.append(str(tmp_path / f"part-{f}.parquet"))
        pq.write_table(table, files[-1])

    def epoch(e, shuffle, skip=0):
        return [[int(i) for i in b.context_ids] for _, b in data.iter_epoch(files, 3, e, 0, 1, 6, 0.5, 7, skip, cache={},
                                                                             shuffle=shuffle)]

    ordered, shuffled = epoch(0, False), epoch(0, True)
    assert len(ordered) == len(shuffled) == 5
    assert sorted(sum(shuffled, [])) == sorted(sum(ordered, [])) == sorted(i for f in range(3) for i in range(100 * f, 100 * f + 10))
    assert len({i // 100 for i in ordered[0]}) == 1 and len({i // 100 for i in shuffled[0]}) > 1, (ordered[0], shuffled[0])
    assert epoch(0, True) == shuffled and epoch(0, True, skip=2) == shuffled[2:]
    assert epoch(1, True) != shuffled
