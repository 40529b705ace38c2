"""Throughput of the Wikipedia parsing layer on the real sample dump, per core.

Reads gensim's embedded enwiki dump (6.1 MB of XML, bz2) in one process and prints MB of
decompressed XML per CPU second (`time.process_time`, so other load on the machine does not
count) for: bz2 decompression alone, reading pages (decompression + page splitting + XML
parsing), and reading + `parse_wikitext` end to end. Each figure is the best of --repeat runs.

    .venv/bin/python benchmarks/bench_wiki_parse.py [--repeat 3] [--dump NAME]
"""

from __future__ import annotations

import argparse
import bz2
import time
from collections import Counter

from eae_data.wikidump import EMBEDDED_DUMP, embedded_dump_path, iter_pages, plan_partitions
from eae_data.wikitext import parse_wikitext


def _decompress(path: str) -> int:
    dec = bz2.BZ2Decompressor()
    total = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            total += len(dec.decompress(chunk))
    return total


def _read(path: str) -> int:
    stats: Counter = Counter()
    for part in plan_partitions([path], 1 << 40):
        for _ in iter_pages(part, stats):
            pass
    return stats["xml_bytes"]


def _read_and_parse(path: str) -> int:
    stats: Counter = Counter()
    for part in plan_partitions([path], 1 << 40):
        for page in iter_pages(part, stats):
            parse_wikitext(page.text)
    return stats["xml_bytes"]


def _best_cpu_seconds(fn, path: str, repeat: int) -> tuple[float, int]:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        nbytes = fn(path)
        best = min(best, time.process_time() - start)
    return best, nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dump", default=EMBEDDED_DUMP, help="file name in gensim's test data")
    args = ap.parse_args()
    path = str(embedded_dump_path(args.dump))

    dec_s, xml_bytes = _best_cpu_seconds(_decompress, path, args.repeat)
    read_s, _ = _best_cpu_seconds(_read, path, args.repeat)
    total_s, _ = _best_cpu_seconds(_read_and_parse, path, args.repeat)
    mb = xml_bytes / 1e6
    print(f"dump: {args.dump} ({mb:.2f} MB of XML)")
    print(f"bz2 decompression only : {mb / dec_s:7.2f} MB/s per core ({dec_s:.3f} CPU s)")
    print(f"read pages (bz2 + XML) : {mb / read_s:7.2f} MB/s per core ({read_s:.3f} CPU s)")
    print(f"read + parse_wikitext  : {mb / total_s:7.2f} MB/s per core ({total_s:.3f} CPU s)")
    print(f"decompression share of end to end: {dec_s / total_s:.0%}")


if __name__ == "__main__":
    main()
