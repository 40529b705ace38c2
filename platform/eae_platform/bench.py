"""GPU benchmarks behind `eae bench`: the training step against BERT, the fused entity memory
against its references, exact top-k search, and data-parallel scaling with the sharded table.

Every figure is measured in the run that prints it; ratios are against a baseline measured in
the same process. Timings: warm-up steps first, then the mean of timed steps between CUDA
synchronisations (model FLOP utilisation against the card's dense bf16 peak).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from eae_model.config import EaEConfig, load_config
from eae_model.mentions import Mentions
from eae_model.model import IGNORE, EaEModel, TargetIndices

# Dense bf16 tensor-core peaks (datasheets, SXM parts), for model FLOP utilisation.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def peak_flops() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def make_batch(batch: int, length: int, num_entities: int, vocab: int, device, seed: int = 0,
               mentions_per_context: float = 4.4):
    """`batch` contexts of `length` wordpieces with ~`mentions_per_context` mentions each (4.4:
    the paper's data, 140M mentions in 32M contexts; the GPU runs' synthetic world has 7.2),
    half of them linked, 20% masked: (ids, mlm labels, mentions)."""
    whole, part = int(mentions_per_context), mentions_per_context - int(mentions_per_context)
    if not 0 <= mentions_per_context <= (length - 2) // 4:
        raise ValueError(f"mentions_per_context must be in [0, {(length - 2) // 4}] for length {length}")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch, length), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    spans, entities = [], []
    for _ in range(batch):
        count = whole + int(torch.rand(1, generator=g) < part)  # mentions_per_context on average
        starts = sorted(torch.randperm((length - 2) // 4, generator=g)[:count].tolist())
        context = [(1 + 4 * s, 1 + 4 * s + int(torch.randint(0, 3, (1,), generator=g))) for s in starts]
        spans.append(context)
        entities.append([int(torch.randint(0, num_entities, (1,), generator=g)) if torch.rand(1, generator=g) < 0.5 else -1
                         for _ in context])
    mentions = Mentions.from_lists(spans, entities)
    labels = torch.full_like(ids, IGNORE)
    masked = torch.rand(len(mentions), generator=g) < 0.2
    for b, s, t in zip(mentions.batch_ids[masked].tolist(), mentions.starts[masked].tolist(), mentions.ends[masked].tolist()):
        labels[b, s : t + 1] = ids[b, s : t + 1]
        ids[b, s : t + 1] = 103
    return ids.to(device), labels.to(device), mentions.to(device)


def timed(step, steps: int, device, warmup: int = 3) -> tuple[float, float | None]:
    """(seconds per step, peak GiB allocated; None off CUDA, where it is not measured) of `step()`."""
    for _ in range(warmup):  # allocator, cuBLAS handles, Triton autotuning
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None  # NaN is no JSON value
    return (time.perf_counter() - start) / steps, peak


# ----------------------------------------------------------------------------- model FLOPs


def transformer_flops(c: EaEConfig, tokens: int, length: int, layers: int) -> float:
    """Forward + backward (3x forward) matmul FLOPs of `layers` BERT layers."""
    per_token = 2 * (4 * c.hidden_size**2 + 2 * c.hidden_size * c.ffn_size)  # QKVO + FFN
    attention = 2 * 2 * length * c.hidden_size  # QK^T and PV, per token
    return 3 * tokens * layers * (per_token + attention)


def bert_flops(c: EaEConfig, tokens: int, length: int) -> float:
    # HF's MLM head scores every position (transform + tied decoder), masked or not.
    head = 2 * (c.hidden_size**2 + c.hidden_size * c.vocab_size)
    return transformer_flops(c, tokens, length, c.l0 + c.l1) + 3 * tokens * head


def eae_flops(c: EaEConfig, tokens: int, length: int, mentions: int, masked_tokens: int, linked: int) -> float:
    """What EaE computes: the layers, TokenPred at masked tokens, per mention the memory
    (scores + weighted sum over N rows) and projections, and per linked mention EntityPred's
    scores over N rows (its EL loss reads no other mention)."""
    head = 2 * (c.hidden_size**2 + c.hidden_size * c.vocab_size)
    table = 2 * c.num_entities * c.entity_dim
    projections = 2 * (2 * c.hidden_size * c.entity_dim) * 2 + 2 * c.entity_dim * c.hidden_size
    memory = 2 * table if c.use_entity_memory else 0
    entity_pred = table if c.use_entity_pred else 0
    return (transformer_flops(c, tokens, length, c.l0 + c.l1) + 3 * masked_tokens * head
            + 3 * mentions * (memory + projections) + 3 * linked * entity_pred)


# ----------------------------------------------------------------------------- step


def eae_step(config: EaEConfig, ids, labels, mentions, device, sharded: bool, compile: str | None):
    from eae_platform.pretrain.loop import compile_modules, cuda_graph_marker

    torch.manual_seed(0)
    table = None
    if sharded:
        from eae_model.sharded_table import ShardedEntityTable

        table = ShardedEntityTable(config.num_entities, config.entity_dim, device=device,
                                   chunk_rows=config.memory_chunk_rows, memory_impl=config.memory_impl)
    model = EaEModel(config, entity_table=table).to(device).train()
    if compile:  # the memory and heads stay eager (their shapes follow the mention count)
        compile_modules(model, compile)
    new_step = cuda_graph_marker(compile, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    # As the batch itself, prepared before the timed steps (the pretraining loop finds them on
    # the host with the batch): the step then never waits for the GPU.
    indices = TargetIndices.of(labels, mentions)

    def step():
        optimizer.zero_grad(set_to_none=True)
        new_step()
        with autocast:
            out = model(ids, mentions=mentions, mlm_labels=labels, validate=False, indices=indices)
        out.loss.backward()
        optimizer.step()

    return step, (model, optimizer)


def _bert_step(c: EaEConfig, ids, labels, device, compile: str | None):
    from transformers import BertConfig, BertForMaskedLM

    from eae_platform.pretrain.loop import cuda_graph_marker

    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                                      num_hidden_layers=c.l0 + c.l1, num_attention_heads=c.num_heads,
                                      intermediate_size=c.ffn_size, max_position_embeddings=512)).to(device)
    optimizer = torch.optim.Adam(bert.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    mask = torch.ones_like(ids)
    forward = torch.compile(bert, mode=compile) if compile else bert
    new_step = cuda_graph_marker(compile, device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        new_step()
        with autocast:
            loss = forward(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()

    return step, (bert, optimizer)


def bench_step(preset: str, batch: int, steps: int, impls: list[str], overrides: list[str], sharded: bool,
               bert: bool = True, compile: str | None = None) -> dict:
    """Measure BERT's MLM step and EaE's step (one per memory impl) on one device; print a table.
    compile: torch.compile's mode for BERT and EaE's stacks (None: eager)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = load_config(preset, overrides=overrides)
    ids, labels, mentions = make_batch(batch, base.max_length, base.num_entities, base.vocab_size, device)
    tokens, M = ids.numel(), len(mentions)
    masked = int((labels != IGNORE).sum())
    linked = int((mentions.entity_ids >= 0).sum())
    peak = peak_flops()
    print(f"device {device_name(device)}, torch {torch.__version__}, preset {preset}, batch {batch} x {base.max_length}"
          f" = {tokens:,} tokens, {M} mentions ({M / batch:.2f}/context), entities {base.num_entities:,} x "
          f"{base.entity_dim}, bf16 autocast: {device.type == 'cuda'}, torch.compile: {compile}", flush=True)
    runs = []
    if bert:
        runs.append(("bert_mlm", None, False))
    for impl in impls:
        runs.append((f"eae_{impl}", impl, False))
    if sharded:
        runs.append((f"eae_sharded1_{impls[0]}", impls[0], True))
    results = {}
    for name, impl, is_sharded in runs:
        if impl is None:
            step, keep = _bert_step(base, ids, labels, device, compile)
            flops = bert_flops(base, tokens, base.max_length)
        else:
            config = load_config(preset, overrides=overrides + [f"memory_impl={impl}"])
            step, keep = eae_step(config, ids, labels, mentions, device, is_sharded, compile)
            flops = eae_flops(config, tokens, config.max_length, M, masked, linked)
        seconds, mem = timed(step, steps, device)
        del step, keep
        if device.type == "cuda":
            torch.cuda.empty_cache()
        results[name] = {"ms": seconds * 1e3, "tokens_per_s": tokens / seconds, "peak_gib": mem,
                         "model_tflop": flops / 1e12, "tflops": flops / seconds / 1e12,
                         "mfu": flops / seconds / peak if peak else None}
        print(f"  measured {name}: {seconds * 1e3:.1f} ms/step", flush=True)
    ref = next((r["ms"] for n, r in results.items() if n.startswith("bert")), None)
    print(f"\n{'step':>24} {'ms/step':>9} {'tokens/s':>11} {'TFLOP/step':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>8} {'vs BERT':>8}")
    for name, r in results.items():
        if ref:
            r["ratio_to_bert"] = r["ms"] / ref
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "-"
        ratio = f"{r['ratio_to_bert']:.2f}x" if ref else "-"
        mem = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        print(f"{name:>24} {r['ms']:9.1f} {r['tokens_per_s']:11,.0f} {r['model_tflop']:10.2f} {r['tflops']:8.1f} "
              f"{mfu:>6} {mem:>8} {ratio:>8}")
    return {"device": device_name(device), "torch": torch.__version__, "preset": preset, "batch": batch,
            "tokens": tokens, "mentions": M, "compile": compile, "results": results}


# ----------------------------------------------------------------------------- memory kernels


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def bench_memory(mentions: int, entities: int, dim: int, reps: int = 10) -> dict:
    """The full-softmax memory (retrieval + lse, forward + backward) at one size: naive dense
    (fp32 logits), chunked PyTorch and the Triton kernels; and the Triton kernels' error
    against a float32 chunked reference on the same bf16 inputs, forward and backward."""
    from eae_model.kernels.fused_memory import block_attention, chunked_backward, chunked_forward

    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    E = (torch.randn(entities, dim, device=device, generator=g) * 0.05).requires_grad_()
    h = torch.randn(mentions, dim, device=device, generator=g).requires_grad_()
    gR = torch.randn(mentions, dim, device=device, generator=g)
    glse = torch.randn(mentions, device=device, generator=g)

    # Exactness: Triton (bf16 inputs, fp32 accumulation) vs chunked in fp32 on the same bf16 values.
    Hb, Eb = h.detach().bfloat16(), E.detach().bfloat16()
    from eae_model.kernels.triton_memory import memory_backward, memory_forward

    R_ref, lse_ref = chunked_forward(Hb.float(), Eb.float(), True, 65536)
    R_t, lse_t = memory_forward(Hb, Eb, True)
    delta = (gR * R_ref).sum(1) - glse
    dH_ref, dE_ref = chunked_backward(Hb.float(), Eb.float(), gR, lse_ref, delta, 65536)
    dH_t, dE_t = memory_backward(Hb, Eb, gR, lse_ref, delta)
    _, lse_t2 = memory_forward(Hb, Eb, False)
    dH2_ref, dE2_ref = chunked_backward(Hb.float(), Eb.float(), None, lse_ref, -glse, 65536)
    dH2_t, dE2_t = memory_backward(Hb, Eb, None, lse_ref, -glse)
    errors = {"R": _rel(R_t, R_ref), "lse": _rel(lse_t, lse_ref), "dH": _rel(dH_t, dH_ref), "dE": _rel(dE_t, dE_ref),
              "lse_only": _rel(lse_t2, lse_ref), "dH_lse_only": _rel(dH2_t, dH2_ref), "dE_lse_only": _rel(dE2_t, dE2_ref)}
    del R_ref, dH_ref, dE_ref, dE_t, dE2_ref, dE2_t

    def naive():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = (h @ E.T).float()
            R = torch.softmax(logits, -1).bfloat16() @ E
            lse = torch.logsumexp(logits, -1)
        ((R.float() * gR).sum() + (lse * glse).sum()).backward()

    def fused(impl, retrieve=True):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                R, lse, _ = block_attention(h, E, retrieve, impl)
            (((R.float() * gR).sum() if retrieve else 0) + (lse * glse).sum()).backward()
        return run

    times = {}
    for name, fn in (("naive_dense", naive), ("chunked_pytorch", fused("chunked")), ("triton", fused("triton")),
                     ("triton_lse_only", fused("triton", False))):
        seconds, mem = timed(fn, reps, device)
        times[name] = {"ms": seconds * 1e3, "peak_gib": mem}
        h.grad = E.grad = None
    flops = 3 * 2 * 2 * mentions * entities * dim  # model FLOPs: 2 matmuls forward, 4 backward
    peak = peak_flops()
    print(f"device {device_name(device)}: memory {mentions} mentions x {entities:,} x {dim}, retrieval + lse, fwd+bwd "
          "(triton_lse_only: the EntityPred head's call, half the model FLOPs)")
    for name, t in times.items():
        t["tflops"] = (flops / 2 if name.endswith("lse_only") else flops) / t["ms"] * 1e3 / 1e12
        mfu = f", {100 * t['tflops'] * 1e12 / peak:.0f}% of bf16 peak" if peak else ""
        print(f"  {name:>16}: {t['ms']:7.2f} ms, {t['tflops']:6.1f} TFLOP/s{mfu}, peak {t['peak_gib']:.1f} GiB")
    print("  triton vs fp32 reference (relative error): " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    return {"device": device_name(device), "mentions": mentions, "entities": entities, "dim": dim,
            "times": times, "errors": errors}


# ----------------------------------------------------------------------------- top-k


def bench_topk(queries: int, entities: int, dim: int, k: int, check: int, reps: int = 3) -> dict:
    """Exact top-k over a bf16 table: naive topk of full score rows, and tile_top_k with its
    fused pass (the Hopper kernel where the GPU is one) and, as the same run's baseline, with
    the Triton pass; recall of each against a float32 brute force on `check` queries, and
    where tile_top_k's time goes."""
    from eae_model.kernels.exact_topk import STATS, chunked_top_k, error_bound, tile_top_k
    from eae_model.kernels.hopper_topk import supported
    from eae_model.kernels.triton_topk import rescore_top_k, select_tiles, tile_top2

    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    E = (torch.randn(entities, dim, device=device, generator=g) * 0.05).bfloat16()
    H = torch.randn(queries, dim, device=device, generator=g).bfloat16()
    norm = float(E.float().norm(dim=1).max())  # kept with the table, as a server would
    pass_kernel = "hopper" if supported(H, E) else "triton"

    def naive(q=H, block=4096):
        return torch.cat([(q[a : a + block] @ E.T).topk(k, dim=1).indices for a in range(0, q.shape[0], block)])

    methods = {"naive_topk": naive,
               "tile_top_k": lambda q=H: tile_top_k(q, E, k, row_norm_max=norm)[1],
               "tile_top_k_triton_pass": lambda q=H: tile_top_k(q, E, k, row_norm_max=norm, kernel="triton")[1]}
    _, ref_ids = chunked_top_k(H[:check], E, k)
    ref_sorted = ref_ids.sort(1).values

    def recall(found):
        hits = (found.sort(1).values[:, :, None] == ref_sorted[:, None, :]).any(-1).sum()
        return hits.item() / ref_ids.numel()

    results = {}
    for name, fn in methods.items():
        before = STATS["fallbacks"]
        seconds, mem = timed(fn, reps, device, warmup=1)
        results[name] = {"ms": seconds * 1e3, "queries_per_s": queries / seconds, "peak_gib": mem,
                         "recall": recall(fn(H[:check]))}
        if name.startswith("tile_top_k"):
            results[name]["fallback_queries"] = STATS["fallbacks"] - before
        print(f"  measured {name}: {seconds * 1e3:.1f} ms", flush=True)
    # Where tile_top_k's time goes, per block of 16,384 queries, its steps as it runs them.
    q = H[:16384]
    tmax, targ, tsec = tile_top2(q, E)
    eps = error_bound(q, E, norm)
    selection = (tmax, targ, tsec, eps, k, k + 16, 16, E.shape[0])  # tile_top_k's slack and max_flagged
    best_rows, flagged, _, n_flagged = select_tiles(*selection)
    parts = {"tile_pass_ms": timed(lambda: tile_top2(q, E), reps, device, 1)[0] * 1e3,
             "tile_pass_triton_ms": timed(lambda: tile_top2(q, E, kernel="triton"), reps, device, 1)[0] * 1e3,
             # The pass with less of its reduction: what each part of it costs.
             "pass_no_second_ms": timed(lambda: tile_top2(q, E, mode=1), reps, device, 1)[0] * 1e3,
             "pass_max_only_ms": timed(lambda: tile_top2(q, E, mode=0), reps, device, 1)[0] * 1e3,
             "select_ms": timed(lambda: select_tiles(*selection), reps, device, 1)[0] * 1e3,
             "rescore_top_k_ms": timed(lambda: rescore_top_k(q, E, best_rows, flagged, n_flagged, k), reps, device, 1)[0] * 1e3,
             "flagged_tiles_per_query": n_flagged.float().mean().item(),
             "matmul_cublas_ms": timed(lambda: q @ E[:262144].T, reps, device, 1)[0] * 1e3 * entities / 262144,
             "whole_ms": timed(lambda: tile_top_k(q, E, k, row_norm_max=norm), reps, device, 1)[0] * 1e3}
    pass_tflops = 2 * q.shape[0] * entities * dim / (parts["tile_pass_ms"] / 1e3) / 1e12
    print(f"device {device_name(device)}: exact top-{k} over {entities:,} x {dim} (bf16), {queries:,} queries; "
          f"recall vs float32 brute force on {check} queries; tile pass: {pass_kernel}")
    for name, r in results.items():
        extra = f", fallback queries {r['fallback_queries']}" if "fallback_queries" in r else ""
        print(f"  {name:>22}: {r['ms']:8.1f} ms, {r['queries_per_s']:12,.0f} queries/s, recall {r['recall']:.4f}, "
              f"peak {r['peak_gib']:.1f} GiB{extra}")
    speedup = results["tile_top_k"]["queries_per_s"] / results["tile_top_k_triton_pass"]["queries_per_s"]
    print(f"  tile_top_k vs the same with the Triton pass: {speedup:.2f}x")
    print(f"  tile_top_k per {q.shape[0]} queries: " + ", ".join(f"{key} {v:.2f}" for key, v in parts.items())
          + f"; pass {pass_tflops:.0f} TFLOP/s")
    return {"device": device_name(device), "queries": queries, "entities": entities, "dim": dim, "k": k,
            "pass_kernel": pass_kernel, "results": results, "speedup_vs_triton_pass": speedup,
            "tile_breakdown": parts, "tile_pass_tflops": pass_tflops}


def _write(result: dict, path: str | None) -> int:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _need_cuda() -> None:
    if not torch.cuda.is_available():
        raise ValueError("this benchmark needs a CUDA GPU")


def run_step(args: argparse.Namespace) -> int:
    # no --impl on a GPU: the config's own memory_impl ("auto"), the figure a user's pretraining
    # gets; on a CPU chunked, since auto's dense path would hold [mentions, entities] logits
    impls = args.impl or (["auto"] if torch.cuda.is_available() else ["chunked"])
    return _write(bench_step(args.preset, args.batch, args.steps, impls, args.set, args.sharded,
                             not args.no_bert, args.compile), args.json)


def run_memory(args: argparse.Namespace) -> int:
    _need_cuda()
    return _write(bench_memory(args.mentions, args.entities, args.dim), args.json)


def run_topk(args: argparse.Namespace) -> int:
    _need_cuda()
    if args.k < 1 or args.queries < 1 or not 0 < args.check <= args.queries:
        raise ValueError("need k >= 1, queries >= 1 and 0 < check <= queries")
    return _write(bench_topk(args.queries, args.entities, args.dim, args.k, args.check), args.json)


# ----------------------------------------------------------------------------- scaling


def measure_steps(rank: int, world: int, device, preset: str, batch: int, steps: int, overrides: list[str],
                   compile: str | None = None, mentions: float = 4.4):
    """On every worker of an initialised process group: time pretraining steps (the loop's
    model, sharded table and gradient sync; compile: the stacks compiled as the job does on
    GPUs, in torch.compile's mode `compile`; None: eager) on a synthetic batch with ~`mentions`
    mentions per context; all workers' figures [seconds per step, peak GiB, table state GiB,
    ms per step in the table's exchanges, ms per step waiting for the gradients' all-reduces
    after the backward], gathered. On a CPU (gloo; the tests) the same code runs in float32
    and the peak memory reads 0."""
    import torch.distributed as dist

    from eae_platform.pretrain.config import PretrainConfig, TrainConfig
    from eae_platform.pretrain.grad_sync import GradientSync
    from eae_platform.pretrain.loop import build_model, compile_stacks, step_marker, sync_and_clip
    from eae_platform.pretrain.profiling import SpanTimer
    from eae_platform.pretrain.state import split_params

    config = PretrainConfig(load_config(preset, overrides=overrides),
                            TrainConfig(num_workers=world, batch_size=batch * world, compile=compile is not None,
                                        compile_mode=compile or "default"))
    model = compile_stacks(build_model(config).to(device).train(), config)
    replicated, table = split_params(model)
    sync = GradientSync(list(replicated.values()))
    cuda = device.type == "cuda"
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=cuda)
    spans = SpanTimer(device)  # as the job times them (exchange_s, grad_sync_wait_s)
    model.entity_table.timer = spans
    c = config.model
    ids, labels, mentions = make_batch(batch, c.max_length, c.num_entities, c.vocab_size, device, seed=rank,
                                       mentions_per_context=mentions)

    indices = TargetIndices.of(labels, mentions)  # as the loop's batches bring them
    new_step = step_marker(config, device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        new_step()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(ids, mentions=mentions, mlm_labels=labels, validate=False, indices=indices).loss
        loss.backward()
        sync_and_clip(sync, list(replicated.values()), list(table.values()), 1.0, spans)
        optimizer.step()

    def synchronize():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(3 if not compile else 5):  # compiling takes the first steps
        step()
    synchronize()
    dist.barrier()
    spans.take()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    seconds = (time.perf_counter() - start) / steps
    waits = spans.take()
    rows = sum(p.numel() for p in table.values())
    table_gib = 4 * rows * 4 / 2**30  # float32 table, gradient and Adam's two moments
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    stats = torch.tensor([seconds, peak, table_gib, waits.get("exchange", 0.0) / steps * 1e3,
                          waits.get("grad_sync_wait", 0.0) / steps * 1e3], device=device)
    gathered = [torch.zeros_like(stats) for _ in range(world)]
    dist.all_gather(gathered, stats)
    return [g.tolist() for g in gathered]


def _scaling_worker(rank: int, world: int, preset: str, batch: int, steps: int, overrides: list[str], port: int, out,
                    options: dict):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    try:
        stats = measure_steps(rank, world, device, preset, batch, steps, overrides, **options)
        if rank == 0:
            out.put(stats)
    finally:
        dist.destroy_process_group()


def _ray_train_worker(config: dict) -> None:
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    stats = measure_steps(ctx.get_world_rank(), ctx.get_world_size(), ray.train.torch.get_device(),
                           config["preset"], config["batch"], config["steps"], config["overrides"], **config["options"])
    if ctx.get_world_rank() == 0:  # Ray Train V2 keeps metrics only with checkpoints: a file
        with open(config["out"], "w") as f:
            json.dump(stats, f)
    ray.train.report({})


def _launch_ray_train(world: int, preset: str, batch: int, steps: int, overrides: list[str], options: dict) -> list:
    """One Ray Train run (TorchTrainer, NCCL process group set up by Ray) of `world` GPU workers."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = f"/tmp/eae-ray-scaling-{os.getpid()}-{world}.json"
    trainer = TorchTrainer(
        _ray_train_worker,
        train_loop_config={"preset": preset, "batch": batch, "steps": steps, "overrides": overrides, "out": out,
                           "options": options},
        scaling_config=ScalingConfig(num_workers=world, use_gpu=True, resources_per_worker={"CPU": 2, "GPU": 1}),
        run_config=RunConfig(name=f"eae-scaling-{world}-{os.getpid()}", storage_path="/tmp/eae-ray-scaling"),
    )
    trainer.fit()
    with open(out) as f:
        return json.load(f)


def bench_scaling(preset: str, batch: int, steps: int, gpus: list[int], overrides: list[str], ray: bool = False,
                  compile: str | None = None, mentions: float = 4.4) -> dict:
    """Data-parallel pretraining steps (sharded table over NCCL, replicated gradients
    all-reduced, as in eae_platform.pretrain.loop) with `batch` contexts per GPU of ~`mentions`
    mentions each (compile: torch.compile's mode for the stacks, as the job on GPUs; None:
    eager), for each GPU count:
    global tokens/s, scaling vs the first count, memory per GPU, and per step the time in the
    table's exchanges and waiting for the gradients' all-reduces (the slowest worker's; what a
    second GPU adds to the step, without the profiler's host overhead). Workers are launched by
    Ray Train (ray=True: TorchTrainer on a local Ray cluster) or by torch.multiprocessing; the
    timed code is the same."""
    import torch.multiprocessing as mp

    if ray:
        import ray as ray_module

        ray_module.init(num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    ctx = mp.get_context("spawn")
    options = {"compile": compile, "mentions": mentions}
    results = {}
    for i, world in enumerate(gpus):
        if world > torch.cuda.device_count():
            raise ValueError(f"{world} GPUs asked for, {torch.cuda.device_count()} present")
        if ray:
            per_rank = _launch_ray_train(world, preset, batch, steps, overrides, options)
        else:
            queue = ctx.Queue()
            mp.start_processes(_scaling_worker, args=(world, preset, batch, steps, overrides, 29500 + i, queue, options),
                               nprocs=world, join=True, start_method="spawn")
            per_rank = queue.get()
        seconds = max(r[0] for r in per_rank)
        tokens = world * batch * load_config(preset, overrides=overrides).max_length
        results[world] = {"ms": seconds * 1e3, "tokens_per_s": tokens / seconds,
                          "peak_gib_per_gpu": [r[1] for r in per_rank], "table_state_gib_per_gpu": [r[2] for r in per_rank],
                          "exchange_ms_per_gpu": [r[3] for r in per_rank], "grad_sync_wait_ms_per_gpu": [r[4] for r in per_rank]}
    first = results[gpus[0]]["tokens_per_s"]
    launcher = "Ray Train (TorchTrainer)" if ray else "torch.multiprocessing"
    print(f"device {device_name(torch.device('cuda'))} x {max(gpus)}: data-parallel steps, {batch} contexts per GPU "
          f"(~{mentions} mentions each), {f'compiled ({compile})' if compile else 'eager'} stacks, workers launched by {launcher}")
    for world, r in results.items():
        r["scaling"] = r["tokens_per_s"] / first
        print(f"  {world} GPU(s): {r['ms']:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s, {r['scaling']:.2f}x, "
              f"peak {max(r['peak_gib_per_gpu']):.1f} GiB/GPU, table + grad + Adam {r['table_state_gib_per_gpu'][0]:.2f} GiB/GPU"
              + (f", exchanges {max(r['exchange_ms_per_gpu']):.2f} ms/step, all-reduce wait "
                 f"{max(r['grad_sync_wait_ms_per_gpu']):.2f} ms/step (slowest GPU)" if world > 1 else ""))
    return {"device": device_name(torch.device("cuda")), "batch_per_gpu": batch, "mentions_per_context": mentions,
            "compiled": compile, "launcher": launcher, "results": results}


def run_scaling(args: argparse.Namespace) -> int:
    _need_cuda()
    gpus = [int(x) for x in args.gpus.split(",")]
    overrides = args.set or ["memory_impl=triton"]
    return _write(bench_scaling(args.preset, args.batch, args.steps, gpus, overrides, args.ray, args.compile,
                                args.mentions), args.json)
