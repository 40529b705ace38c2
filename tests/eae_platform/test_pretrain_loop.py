"""Unit tests of the training loop's helpers that need no Ray: the entity table's memory
footprint per worker, the reductions over workers (gloo here; NCCL only on GPUs), and the
periodic dev evaluation over a sharded table."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
import torch.distributed as dist

from eae_model.config import load_config
from eae_model.mentions import Mentions
from eae_model.metrics import add_masked_prediction, masked_prediction_metrics
from eae_model.model import IGNORE, EaEModel, TargetIndices
from eae_model.sharded_table import ShardedEntityTable
from eae_platform.pretrain import data, loop
from eae_platform.pretrain.grad_sync import GradientSync
from tests.eae_platform.gloo_workers import run_workers


def _adam_step(params: list[torch.nn.Parameter]) -> torch.optim.Adam:
    optimizer = torch.optim.Adam(params, lr=1e-3)
    sum(p.sum() for p in params).backward()
    optimizer.step()
    return optimizer


def test_table_memory_counts_rows_gradients_and_adam_state():
    rows = [torch.nn.Parameter(torch.zeros(10, 8)), torch.nn.Parameter(torch.zeros(3, 8))]
    optimizer = torch.optim.Adam(rows, lr=1e-3)
    row_bytes = (10 + 3) * 8 * 4
    assert loop.table_memory_bytes(rows, optimizer) == row_bytes  # no gradient, no state yet
    optimizer = _adam_step(rows)
    steps = sum(optimizer.state[p]["step"].numel() * optimizer.state[p]["step"].element_size() for p in rows)
    # rows + gradients + Adam's two moments (+ its step counters)
    assert loop.table_memory_bytes(rows, optimizer) == 4 * row_bytes + steps
    for p in rows:
        p.grad = None  # after zero_grad(set_to_none=True): the gradients are not held
    assert loop.table_memory_bytes(rows, optimizer) == 3 * row_bytes + steps


def test_memory_metrics_on_one_worker_without_gpu():
    rows = [torch.nn.Parameter(torch.zeros(2**10, 2**8))]  # 1 MiB of float32
    metrics = loop.memory_metrics(rows, _adam_step(rows), torch.device("cpu"))
    assert set(metrics) == {"table_gib_per_worker"}  # no GPU peak on CPU
    assert abs(metrics["table_gib_per_worker"] - 4 / 2**10) < 1e-6


def _memory_and_sums(rank: int, world: int):
    rows = [torch.nn.Parameter(torch.zeros(2**10 * (rank + 1), 2**8))]  # rank r: r+1 MiB
    metrics = loop.memory_metrics(rows, _adam_step(rows), torch.device("cpu"))
    return metrics, loop._sum_over_workers({"tokens": 10.0 * (rank + 1)})


def test_table_memory_is_the_largest_shard_over_workers(tmp_path):
    results = run_workers(_memory_and_sums, 2, tmp_path)
    for rank, (metrics, sums) in enumerate(results):
        assert abs(metrics["table_gib_per_worker"] - 2 * 4 / 2**10) < 1e-6, rank  # rank 1's 2 MiB x 4
        assert sums == {"tokens": 30.0}


def _out_of_time(rank: int, world: int) -> list[bool]:
    """What each worker answers, in four cases where only rank 1 is out of time or none is."""
    import time

    from eae_platform.pretrain.config import TrainConfig

    now, started = time.time(), time.perf_counter()
    answers = []
    for budget_s, deadline in (
        (None, None),                                   # no limit: never out of time
        (None, now + 3600 if rank == 0 else now - 1),   # rank 1's clock is past the deadline
        (None, now + 3600),                             # the deadline is an hour away everywhere
        (3600.0 if rank == 0 else 1e-9, None),          # rank 1 has spent its budget
    ):
        answers.append(loop.out_of_time_on_any_worker(TrainConfig(time_budget_s=budget_s, deadline=deadline), started))
    return answers


def test_train_deadline_and_time_budget_stop_every_worker_when_one_is_out_of_time(tmp_path):
    """train.deadline (wall-clock) and train.time_budget_s (since the first step): the answer
    is a max over workers, so every worker pauses at the same step."""
    for rank, answers in enumerate(run_workers(_out_of_time, 2, tmp_path)):
        assert answers == [False, True, False, True], rank


def test_collectives_use_cuda_tensors_under_nccl(monkeypatch):
    # NCCL reduces CUDA tensors only: a CPU tensor fails there ("No backend type associated
    # with device type cpu"), so the loop's reductions must build theirs on the GPU.
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert loop._collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert loop._collective_device() == torch.device("cpu")


def _grads(seed: int, scale: float) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(5, 3)), torch.nn.Parameter(torch.zeros(7))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    return params


def test_sync_and_clip_clips_as_torch_does_and_returns_a_tensor():
    """One worker: the global norm over replicated and table gradients, clipped like
    torch.nn.utils.clip_grad_norm_ (no host sync: the norm comes back as a 0-d tensor)."""
    for scale, max_norm in [(10.0, 1.0), (0.01, 1.0), (10.0, 0.0)]:
        ours, ref = _grads(0, scale), _grads(0, scale)
        norm = loop.sync_and_clip(GradientSync(ours[:1]), ours[:1], ours[1:], max_norm)
        assert torch.is_tensor(norm) and norm.dim() == 0
        want = torch.cat([p.grad.flatten() for p in ref]).norm()
        torch.testing.assert_close(norm, want)
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(ref, max_norm)
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a.grad, b.grad)
        if scale == 10.0 and max_norm:
            assert float(torch.cat([p.grad.flatten() for p in ours]).norm()) == pytest.approx(max_norm, rel=1e-5)


@pytest.mark.parametrize("use_gpu,compile,expected", [(True, None, True), (False, None, False), (False, True, True),
                                                      (True, False, False)])
def test_transformer_stacks_are_compiled_on_gpus_by_default(use_gpu, compile, expected):
    from eae_platform.pretrain.config import load_pretrain_config

    config = load_pretrain_config(preset="tiny", overrides=[
        f"train.use_gpu={str(use_gpu).lower()}", f"train.compile={'null' if compile is None else str(compile).lower()}"])
    model = loop.compile_stacks(loop.build_model(config), config)
    stacks = (model.token_embed, model.transformer_l0, model.transformer_l1)
    assert [m._compiled_call_impl is not None for m in stacks] == [expected] * 3  # nn.Module.compile's marker
    assert all(m._compiled_call_impl is None for m in (model.mention_head, model.entity_memory))


@pytest.mark.parametrize("mode,graphs", [("default", False), ("reduce-overhead", True)])
def test_compile_mode_reaches_the_stacks(mode, graphs):
    from eae_platform.pretrain.config import load_pretrain_config

    config = load_pretrain_config(preset="tiny", overrides=["train.compile=true", f"train.compile_mode={mode}"])
    model = loop.compile_stacks(loop.build_model(config), config)
    for m in (model.token_embed, model.transformer_l0, model.transformer_l1):
        assert m._compiled_call_impl.get_compiler_config()["triton.cudagraphs"] is graphs


def test_steps_mark_new_cuda_graph_iterations_only_with_cuda_graphs():
    from eae_platform.pretrain.config import load_pretrain_config

    def marker(device, *overrides):
        return loop.step_marker(load_pretrain_config(preset="tiny", overrides=list(overrides)), torch.device(device))

    mark = torch.compiler.cudagraph_mark_step_begin
    assert marker("cuda", "train.use_gpu=true", "train.compile_mode=reduce-overhead") is mark
    assert marker("cuda", "train.compile=true", "train.compile_mode=max-autotune") is mark
    assert marker("cuda", "train.use_gpu=true") is not mark  # default mode: no CUDA graphs
    assert marker("cuda", "train.compile=false", "train.compile_mode=reduce-overhead") is not mark  # eager
    assert marker("cpu", "train.compile=true", "train.compile_mode=reduce-overhead") is not mark
    marker("cpu")()  # the others do nothing


def test_an_unknown_compile_mode_is_refused_with_the_modes():
    from eae_platform.pretrain.config import load_pretrain_config

    with pytest.raises(ValueError, match="compile_mode must be one of default, reduce-overhead.*got 'fast'"):
        load_pretrain_config(preset="tiny", overrides=["train.compile_mode=fast"])


def test_train_init_encoder_starts_the_model_from_the_shipped_encoder():
    """train.init_encoder=minilm: build_model (every rank's, before any checkpoint is restored)
    copies the shipped MiniLM's weights into the embeddings and both stacks."""
    from safetensors.torch import load_file

    from eae_model.pretrained import encoder_dir
    from eae_platform.pretrain.config import load_pretrain_config

    config = load_pretrain_config(preset="minilm", overrides=["model.num_entities=16", "train.init_encoder=minilm"])
    model = loop.build_model(config)
    weights = load_file(str(encoder_dir("minilm") / "model.safetensors"))
    assert torch.equal(model.token_embed.word.weight, weights["embeddings.word_embeddings.weight"])
    assert torch.equal(model.transformer_l1.layers[3].ffn_out.weight, weights["encoder.layer.5.output.dense.weight"])
    fresh = loop.build_model(load_pretrain_config(preset="minilm", overrides=["model.num_entities=16"]))
    assert not torch.equal(fresh.token_embed.word.weight, weights["embeddings.word_embeddings.weight"])


@pytest.mark.parametrize("variant", [[], ["model.use_entity_memory=false"]], ids=["eae", "no_eae"])
def test_memory_lr_scale_gives_the_table_and_the_memory_their_own_lr(variant):
    """train.memory_lr_scale=10: the entity table, W_f, W_b and the memory's LayerNorm learn at
    10 x train.lr through the whole schedule, every other weight at train.lr; 1 (the default):
    one group. No-EaE has no memory layer: only its table is scaled."""
    from eae_platform.pretrain.config import load_pretrain_config

    overrides = ["model.num_entities=16", "train.lr=1e-4", "train.max_steps=10", "train.warmup_fraction=0.2", *variant]
    config = load_pretrain_config(preset="tiny", overrides=overrides + ["train.memory_lr_scale=10"])
    model = loop.build_model(config)
    optimizer, scheduler = loop.build_optimizer(model, config.train, torch.device("cpu"))
    names = {p: n for n, p in model.named_parameters()}
    rest, memory = ({names[p] for p in g["params"]} for g in optimizer.param_groups)
    expected = {n for n in names.values() if n.startswith(("entity_table.", "entity_memory.", "memory_norm."))}
    if config.model.use_entity_memory:
        assert {"entity_memory.project_query.weight", "entity_memory.project_value.weight",
                "memory_norm.weight", "memory_norm.bias"} < expected
    assert memory == expected and "entity_table.weight" in memory
    assert rest == set(names.values()) - expected
    for _ in range(5):  # into the decay: the schedule scales both groups alike
        optimizer.step()
        scheduler.step()
    lrs = scheduler.get_last_lr()
    assert lrs[0] == pytest.approx(1e-4 * loop.lr_lambda(10, 0.2)(5)) and lrs[1] == pytest.approx(10 * lrs[0])

    one = load_pretrain_config(preset="tiny", overrides=overrides)
    optimizer, _ = loop.build_optimizer(loop.build_model(one), one.train, torch.device("cpu"))
    assert len(optimizer.param_groups) == 1 and optimizer.param_groups[0]["initial_lr"] == 1e-4


def test_memory_lr_scale_must_be_positive():
    from eae_platform.pretrain.config import load_pretrain_config

    with pytest.raises(ValueError, match="memory_lr_scale must be positive, got 0"):
        load_pretrain_config(preset="tiny", overrides=["train.memory_lr_scale=0"])


DEV_ENTITIES = 23


class _RecordingTable(ShardedEntityTable):
    """The sharded table, recording of each call whether it was given entity ids (a linking loss)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.given_ids: list[bool] = []

    def attend(self, h, k=None, targets=None, retrieve=True):
        self.given_ids.append(targets is not None)
        return super().attend(h, k, targets, retrieve)

    forward = attend


def _dev_model(table: ShardedEntityTable | None = None) -> EaEModel:
    """The same tiny EaE model in every process (its table: `table`, else the whole sharded table
    of one process), E drawn from a fixed seed."""
    torch.manual_seed(0)
    config = load_config("tiny", overrides=[f"num_entities={DEV_ENTITIES}"])
    table = table if table is not None else ShardedEntityTable(DEV_ENTITIES, config.entity_dim)
    table.load_full(torch.randn(DEV_ENTITIES, config.entity_dim, generator=torch.Generator().manual_seed(1)))
    return EaEModel(config, entity_table=table).eval()


def _dev_batch(rank: int, config) -> data.Batch:
    """Worker `rank`'s dev batch: 3 contexts, 7 mentions (one unlinked), 5 of them masked (their
    first token [MASK]; 4 linked, the entity accuracy's) and one more masked token."""
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(1000, config.vocab_size, (3, 16), generator=g)
    mentions = Mentions.from_lists([[(1, 2), (5, 5), (9, 10)], [(3, 4), (8, 9)], [(2, 2), (6, 7)]],
                                   [[3, -1, 20], [5, 7 + rank], [11, 0]])
    labels = torch.full_like(ids, IGNORE)
    for b, position in ((0, 1), (0, 5), (0, 9), (1, 3), (2, 6), (1, 12)):
        labels[b, position], ids[b, position] = ids[b, position], config.mask_token_id
    return data.Batch(torch.arange(3), ids, torch.ones_like(ids), labels, mentions, TargetIndices.of(labels, mentions))


def _sharded_dev_evaluation(rank: int, world: int):
    table = _RecordingTable(DEV_ENTITIES, load_config("tiny").entity_dim)
    model = _dev_model(table)
    return loop.evaluate(model, [_dev_batch(rank, model.config)], torch.device("cpu")), table.given_ids


def test_the_dev_evaluation_over_a_sharded_table_equals_one_process_and_computes_no_linking_loss(tmp_path):
    """Pretraining's periodic dev evaluation (`loop.evaluate`) on 2 gloo workers, each with its
    half of E and its own batch, gives what one process gives on both batches with the whole
    table, and what the forward given the entity ids (the linking losses computed) gives; no
    table call on a worker was given entity ids."""
    results = run_workers(_sharded_dev_evaluation, 2, tmp_path)
    model = _dev_model()
    batches = [_dev_batch(rank, model.config) for rank in (0, 1)]
    one_process = loop.evaluate(model, batches, torch.device("cpu"))
    sums = defaultdict(float)
    model.eval()  # evaluate leaves it in training mode
    with torch.no_grad():
        for b in batches:  # the forward given the ids, as the evaluation was before
            out = model(b.input_ids, b.attention_mask, mentions=b.mentions, mlm_labels=b.mlm_labels, indices=b.indices)
            assert {"memory_el", "entity_pred"} <= set(out.losses)
            add_masked_prediction(sums, model, out, b.input_ids, b.mentions, b.mlm_labels)
    given_ids = {f"dev/{k}": v for k, v in masked_prediction_metrics(sums).items()}
    assert set(one_process) == {"dev/entity_accuracy", "dev/token_accuracy", "dev/perplexity"}
    assert sums["entities"] == 2 * 4 and sums["tokens"] == 2 * 6
    for metrics, calls in results:
        assert metrics.keys() == one_process.keys()
        for key, value in one_process.items():
            assert metrics[key] == pytest.approx(value, abs=1e-6) and given_ids[key] == pytest.approx(value, abs=1e-6)
        assert calls and not any(calls), calls  # the memory's and EntityPred's, neither given ids
