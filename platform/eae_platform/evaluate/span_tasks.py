"""What entity typing and relation extraction share: a classifier on the representations X4
at a few positions of each example, trained on top of the pretrained model.

    logits = W [x4[p_1] ‖ ... ‖ x4[p_P]]          positions p: a span's start and end (typing),
                                                  the subject and object start markers (RE)

The model reads every example without given mentions, relying on its own mention detection
(the paper: "without extra annotations for mention annotations or entity linking"); so the
entity embeddings and the mention-detection head are frozen, the rest is fine-tuned (paper
appendix "Entity Typing"). Examples come from `eae data build` shards (distant supervision),
or from the tasks' official formats.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from eae_model.model import EaEModel
from eae_platform import task_stop

SPLITS = ("train", "dev", "test")


@dataclass
class Example:
    ids: list[int]  # [CLS] ... [SEP] wordpieces
    positions: list[int]  # where the classifier reads X4
    target: list[int] | int  # typing: type indices; RE: the relation index


class PositionClassifier(nn.Module):
    def __init__(self, model: EaEModel, num_positions: int, num_labels: int):
        super().__init__()
        self.model = model
        self.head = nn.Linear(num_positions * model.config.hidden_size, num_labels)
        nn.init.normal_(self.head.weight, std=model.config.init_std)
        nn.init.zeros_(self.head.bias)
        for module in (model.entity_table, model.mention_head):
            if module is not None:
                module.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask [B, L]; positions [B, P] -> logits [B, C]."""
        x4 = self.model(input_ids, attention_mask).x4  # mentions: the model's own
        rows = torch.arange(len(positions), device=positions.device)[:, None]
        return self.head(x4[rows, positions].flatten(1).float())


def collate(examples: list[Example], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    length = max(len(e.ids) for e in examples)
    ids = torch.zeros((len(examples), length), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, e in enumerate(examples):
        ids[b, : len(e.ids)] = torch.tensor(e.ids)
        mask[b, : len(e.ids)] = 1
    positions = torch.tensor([e.positions for e in examples])
    return ids.to(device), mask.to(device), positions.to(device)


def train(classifier: PositionClassifier, examples: list[Example], loss_fn, config, device: torch.device, log=None) -> None:
    """config.steps Adam steps of config.batch_size examples, lr config.lr with the paper's
    warmup and linear decay; log(metrics, step) every 50 steps."""
    from eae_platform.finetune.qa import index_batches
    from eae_platform.pretrain.loop import lr_lambda

    if not examples:
        raise ValueError("no training example")
    torch.manual_seed(config.seed)
    params = [p for p in classifier.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=config.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config.steps, 0.05))
    batches = index_batches(len(examples), config.batch_size, config.seed)
    classifier.train()
    window = 0.0
    for step in range(1, config.steps + 1):
        task_stop.check()  # the command was stopped
        chunk = [examples[i] for i in next(batches)]
        logits = classifier(*collate(chunk, device))
        loss = loss_fn(logits, [e.target for e in chunk])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        window += float(loss.detach())
        if log and (step % 50 == 0 or step == config.steps):
            log({"train/loss": window / (step % 50 or 50)}, step)
            window = 0.0
    classifier.eval()


@torch.no_grad()
def predict(classifier: PositionClassifier, examples: list[Example], device: torch.device, batch_size: int = 64) -> torch.Tensor:
    """[N, C] logits."""
    classifier.eval()
    out = [classifier(*collate(examples[i : i + batch_size], device)).cpu() for i in range(0, len(examples), batch_size)]
    return torch.cat(out) if out else torch.zeros(0, classifier.head.out_features)


def load_splits(task: str, spec: str, sources: dict[str, tuple[int, int | None, Callable[[list[str], Counter], dict]]],
                usage: str, max_examples: int) -> tuple[dict[str, list], Counter]:
    """A `--data KIND:ARG,...` spec -> ({split: at most max_examples examples}, skipped).
    sources[KIND] = (fewest ARGs, most ARGs or None for any number, build(ARGs, skipped) ->
    {split: examples}). A clear error for an unknown KIND, a wrong number of ARGs (both name
    `usage`) or a split left without examples."""
    kind, _, rest = spec.partition(":")
    args = [a for a in rest.split(",") if a]
    skipped: Counter = Counter()
    fewest, most, build = sources.get(kind, (0, None, None))
    if build is None or len(args) < fewest or (most is not None and len(args) > most):
        raise ValueError(f"{task} data {spec!r}: use {usage}")
    data = {split: examples[:max_examples] for split, examples in build(args, skipped).items()}
    for split in SPLITS:
        if not data[split]:
            raise ValueError(f"{task} data {spec!r} has no {split} example (skipped: {dict(skipped)})")
    return data, skipped


def read_shard_rows(data_dir: str | Path, split: str, limit: int = 0) -> list[dict]:
    """Rows of an `eae data build` split: token_ids and mention starts, ends, entity ids."""
    import pyarrow.parquet as pq

    from eae_data.shards import shard_files

    files = shard_files(data_dir, split)
    if not files:
        raise FileNotFoundError(f"no {split} shards under {data_dir}/shards/{split}: give an `eae data build` output")
    rows = []
    for f in files:
        rows += pq.read_table(f, columns=["token_ids", "mention_starts", "mention_ends", "mention_entity_ids"]).to_pylist()
        if limit and len(rows) >= limit:
            break
    return rows


def entity_titles(data_dir: str | Path) -> list[str]:
    import pyarrow.parquet as pq

    path = Path(data_dir) / "entities.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: give an `eae data build` output directory")
    return pq.read_table(path).sort_by("entity_id").column("title").to_pylist()


def wordnet_nouns(path: str | Path) -> tuple[dict[str, list[str]], dict[str, list[tuple[str, str]]]]:
    """data.noun -> (synset offset -> lemmas, synset offset -> [(pointer symbol, target offset)])."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: install Debian's wordnet-base (scripts/bootstrap installs it)")
    lemmas, pointers = {}, {}
    for line in path.read_text(encoding="latin-1").splitlines():
        if line.startswith(" "):
            continue
        fields = line.split(" | ", 1)[0].split()
        count = int(fields[3], 16)
        lemmas[fields[0]] = [fields[4 + 2 * i].replace("_", " ") for i in range(count)]
        i = 4 + 2 * count
        pointers[fields[0]] = [(fields[i + 1 + 4 * j], fields[i + 2 + 4 * j]) for j in range(int(fields[i]))
                               if fields[i + 3 + 4 * j] == "n"]
    return lemmas, pointers
