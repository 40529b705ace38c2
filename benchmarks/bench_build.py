"""End-to-end throughput of the Wikipedia build per core: MB of dump XML per CPU second for
the two per-partition stages that Ray runs in parallel (parse; contexts = alias matching,
chunking, tokenization, mention alignment, Parquet writing), in one process, on the real
sample dump shipped in gensim. The driver's vocabulary step runs between them and is timed
apart. A cluster of C cores processes roughly C times the per-core figure.

    .venv/bin/python benchmarks/bench_build.py [--entities 5000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter

from eae_data.wikidump import embedded_dump_path, plan_partitions
from eae_platform.preprocess import stages
from eae_platform.preprocess.build import embedded_settings
from eae_platform.preprocess.vocab import EntityVocab, alias_table, resolve_redirects


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        settings = embedded_settings(out, entities=args.entities)
        (partition,) = plan_partitions(settings.dumps, settings.partition_bytes)
        t0 = time.process_time()
        parsed = stages.parse_partition(partition, 0, out)
        t1 = time.process_time()
        redirects, _ = resolve_redirects(parsed["redirects"])
        counts = Counter()
        for target, n in parsed["target_counts"].items():
            counts[redirects.get(target, target)] += n
        vocab = EntityVocab.most_frequent(counts, settings.entities)
        anchors = Counter({tuple(k.split("\t", 1)): v for k, v in parsed["anchor_counts"].items()})
        aliases = sorted(set(alias_table(anchors, redirects, vocab).column("alias").to_pylist()))
        t2 = time.process_time()
        stage = {**settings.__dict__, "key": settings.contexts_key()}
        built = stages.contexts_partition(0, out, vocab.ids, redirects, aliases, stage)
        t3 = time.process_time()
    mb = parsed["read"]["xml_bytes"] / 1e6
    print(f"dump: {embedded_dump_path().name} ({mb:.2f} MB of XML)")
    print(f"parse stage    : {mb / (t1 - t0):7.2f} MB/s per core ({t1 - t0:.2f} CPU s)")
    print(f"contexts stage : {mb / (t3 - t2):7.2f} MB/s per core ({t3 - t2:.2f} CPU s, "
          f"{sum(v for k, v in built['counts'].items() if k.startswith('contexts_')):,} contexts)")
    print(f"both stages    : {mb / (t1 - t0 + t3 - t2):7.2f} MB/s per core")
    print(f"driver vocab   : {t2 - t1:.2f} CPU s")


if __name__ == "__main__":
    main()
