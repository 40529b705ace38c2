"""What an evaluation's forward costs on a GPU: the entity-linking losses, and new lengths.

`eae eval masked` (eae_platform.evaluate.masked.masked_metrics) needs no loss, but it gave the
model its mentions' entity ids, so the forward computed the memory's and EntityPred's linking
losses, each a softmax over all N entities; and it pads each batch to its longest context, so
a split's batches come in many lengths, each new one costing the eager model new kernel plans
(training pads every batch to one length for that reason: docs/performance.md). Round 37's
evaluation of three `small` 100k-world cells took 230 s for the masked hyperlinks (~1,500
batches). This prints, in one run, ms per batch of the evaluation loop (the model, then the
masked-prediction metrics) over the same `--batches` batches of random contexts, whose longest
context is drawn from --min-length..max_length:

  1. with the entity ids, each batch at its own length (the loop before: the baseline);
  2. without them (masked_metrics now);
  3. with them, every batch padded to max_length (pretraining's periodic dev evaluation before:
     its batches have one length);
  4. without them, padded (that evaluation now, eae_platform.pretrain.loop.evaluate);

twice (the second pass has seen every length), each with its ratio to 1 and its metrics.

    python benchmarks/bench_eval_shapes.py [--preset small] [--entities 100000] [--batches 100] [--batch 128]
    python benchmarks/bench_eval_shapes.py --batches 20 --batch 512   # one dev evaluation of round 19's recipe

Pure PyTorch (eae_model alone): it runs on the lent GPU machines without the wheels.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from eae_data.constants import MASK_TOKEN_ID
from eae_model.config import config_from_values
from eae_model.mentions import Mentions
from eae_model.metrics import add_masked_prediction, masked_prediction_metrics
from eae_model.model import IGNORE, EaEModel


def make_batches(n: int, batch: int, min_length: int, max_length: int, num_entities: int, vocab: int,
                 seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, Mentions, torch.Tensor]]:
    """n batches of `batch` contexts: lengths up to a batch's longest, drawn per batch; ~7
    one- or two-wordpiece mentions a context, a fifth of them masked (their tokens the labels)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        longest = int(torch.randint(min_length, max_length + 1, (1,), generator=g))
        lengths = torch.randint(min_length // 2, longest + 1, (batch,), generator=g)
        lengths[0] = longest
        ids = torch.randint(1000, vocab, (batch, longest), generator=g)
        attention = (torch.arange(longest)[None, :] < lengths[:, None]).long()
        ids = ids * attention
        b_ids, starts = [], []
        for b, length in enumerate(lengths.tolist()):
            pos = torch.randperm(length - 2, generator=g)[:7].sort().values
            pos = pos[torch.cat([torch.tensor([True]), pos[1:] - pos[:-1] > 2])]  # no overlap
            b_ids += [b] * len(pos)
            starts += pos.tolist()
        b_ids, starts = torch.tensor(b_ids), torch.tensor(starts)
        ends = starts + torch.randint(0, 2, starts.shape, generator=g)
        entities = torch.randint(0, num_entities, starts.shape, generator=g)
        labels = torch.full_like(ids, IGNORE)
        for b, s, t in zip(b_ids.tolist(), starts.tolist(), ends.tolist()):
            if torch.rand(1, generator=g) < 0.2:
                labels[b, s:t + 1] = ids[b, s:t + 1]
                ids[b, s:t + 1] = MASK_TOKEN_ID
        out.append((ids, attention, Mentions(b_ids, starts, ends, entities), labels))
    return out


def pad(batch, length: int):
    ids, attention, mentions, labels = batch
    extra = length - ids.shape[1]
    z = lambda t, v: torch.nn.functional.pad(t, (0, extra), value=v)  # noqa: E731
    return z(ids, 0), z(attention, 0), mentions, z(labels, IGNORE)


@torch.no_grad()
def run(model: EaEModel, batches, device: torch.device, entity_ids: bool) -> tuple[float, dict]:
    """(ms per batch, masked-prediction metrics) of the evaluation loop over `batches`, the
    model given the mentions' entity ids or not (the metrics read them either way)."""
    sums: dict[str, float] = defaultdict(float)
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for ids, attention, m, labels in batches:
        ids, attention, labels = ids.to(device), attention.to(device), labels.to(device)
        m = m.to(device)
        given = m if entity_ids else m.spans()
        out = model(ids, attention, mentions=given, mlm_labels=labels)
        add_masked_prediction(sums, model, out, ids, m, labels)  # its float()s wait for the GPU
    return 1000 * (time.perf_counter() - started) / len(batches), masked_prediction_metrics(sums)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--entities", type=int, default=100_000)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--min-length", type=int, default=24)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    device = torch.device(a.device)
    torch.manual_seed(0)
    config = config_from_values(a.preset, {"num_entities": a.entities})
    model = EaEModel(config).to(device).eval()
    batches = make_batches(a.batches, a.batch, a.min_length, config.max_length, a.entities, config.vocab_size)
    lengths = {b[0].shape[1] for b in batches}
    print(f"{a.preset}, {a.entities:,} entities, {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}: {a.batches} batches of {a.batch}, {len(lengths)} lengths "
          f"({min(lengths)}-{max(lengths)})")
    padded = [pad(b, config.max_length) for b in batches]
    for ids in (True, False):  # the padded shape's first call, out of the timing
        run(model, padded[:2], device, ids)
    modes = {"entity ids, own lengths (before)": (batches, True), "no entity ids, own lengths (now)": (batches, False),
             f"entity ids, padded to {config.max_length} (dev, before)": (padded, True),
             f"no entity ids, padded to {config.max_length} (dev, now)": (padded, False)}
    for label in ("first pass", "second pass"):
        print(f"{label}:")
        base = None
        for mode, (bs, ids) in modes.items():
            ms, metrics = run(model, bs, device, ids)
            base = base or ms
            print(f"  {mode:42s} {ms:7.1f} ms/batch  {base / ms:5.2f}x  "
                  + " ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())))


if __name__ == "__main__":
    main()
