"""One pretraining step (forward, backward, Adam) of EaE against Hugging Face's BertForMaskedLM,
in one process on one device, with the same batch:

    python benchmarks/bench_pretrain_step.py --preset paper --batch 256          # on a GPU
    .venv/bin/python benchmarks/bench_pretrain_step.py --preset tiny --batch 8 --steps 3   # CPU smoke run

The batch: `batch` contexts of 128 wordpieces, ~4.4 mentions each (the paper's data: 140M
mentions in 32M contexts), half of them linked, 20% of mentions masked. EaE runs with the
local EntityTable and with the ShardedEntityTable of distributed training (here one worker:
chunked scores, recomputed in the backward). bf16 autocast on CUDA. Prints ms/step, tokens/s,
peak memory and the ratio to the BERT step.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from eae_model.config import load_config
from eae_model.mentions import Mentions
from eae_model.model import IGNORE, EaEModel


def make_batch(batch: int, length: int, num_entities: int, vocab: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch, length), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    spans, entities = [], []
    for _ in range(batch):
        count = 4 + int(torch.rand(1, generator=g) < 0.4)  # 4.4 on average
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


def timed(step, steps: int, device) -> tuple[float, float]:
    for _ in range(2):  # warm-up (allocator, kernels)
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return (time.perf_counter() - start) / steps, peak


def bench_eae(config, ids, labels, mentions, steps, device, table: str):
    torch.manual_seed(0)
    entity_table = None
    if table == "sharded":
        from eae_platform.sharded_table import ShardedEntityTable

        entity_table = ShardedEntityTable(config.num_entities, config.entity_dim, device=device)
    model = EaEModel(config, entity_table=entity_table).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step():
        with autocast:
            out = model(ids, mentions=mentions, mlm_labels=labels, validate=False)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()

    result = timed(step, steps, device)
    del model, optimizer
    return result


def bench_bert(config, ids, labels, steps, device):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                                      num_hidden_layers=config.l0 + config.l1, num_attention_heads=config.num_heads,
                                      intermediate_size=config.ffn_size, max_position_embeddings=config.max_length)).to(device)
    optimizer = torch.optim.Adam(bert.parameters(), lr=1e-4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    mask = torch.ones_like(ids)

    def step():
        with autocast:
            loss = bert(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    result = timed(step, steps, device)
    del bert, optimizer
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip-bert", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = load_config(args.preset, overrides=["dropout=0.1"] if args.preset == "paper" else [])
    ids, labels, mentions = make_batch(args.batch, config.max_length, config.num_entities, config.vocab_size, device)
    tokens = ids.numel()
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, preset {args.preset}, batch {args.batch} x {config.max_length}, "
          f"{len(mentions)} mentions ({len(mentions) / args.batch:.2f}/context), entities {config.num_entities:,} x {config.entity_dim}")
    results = {}
    if not args.skip_bert:
        results["bert_mlm"] = bench_bert(config, ids, labels, args.steps, device)
    for table in ("dense", "sharded"):
        results[f"eae_{table}_table"] = bench_eae(config, ids, labels, mentions, args.steps, device, table)
    base = results.get("bert_mlm", (None,))[0]
    for name, (seconds, peak) in results.items():
        ratio = f", {seconds / base:.2f}x BERT" if base else ""
        print(f"{name:>20}: {seconds * 1e3:8.1f} ms/step, {tokens / seconds:10,.0f} tokens/s, peak {peak:.1f} GiB{ratio}")
    print(json.dumps({k: {"ms": v[0] * 1e3, "tokens_per_s": tokens / v[0], "peak_gib": v[1]} for k, v in results.items()}))


if __name__ == "__main__":
    main()
