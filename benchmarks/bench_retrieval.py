"""Top-k entity retrieval through faiss: exact (flat) against the approximate indexes (ivf,
hnsw) the server offers for very large tables: recall@k against exact search, queries/s and
build time, on one table in the same run.

    .venv/bin/python benchmarks/bench_retrieval.py [--entities 200000] [--dim 128] [--queries 2000]
    .venv/bin/python benchmarks/bench_retrieval.py --model DIR     # a trained model's E, its own rows as queries

The synthetic table is clustered like learned embeddings (rows around 2,000 centres, norms
varying); queries are rows plus noise, as pseudo entity embeddings lie near their entity's
row. Recall@k = |approximate top-k ∩ exact top-k| / k, averaged over queries.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def synthetic(n: int, d: int, q: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(2000, d)).astype(np.float32)
    table = centres[rng.integers(0, len(centres), n)] + 0.5 * rng.normal(size=(n, d)).astype(np.float32)
    table *= rng.uniform(0.5, 1.5, size=(n, 1)).astype(np.float32)  # norms vary, as in a trained E
    queries = table[rng.integers(0, n, q)] + 0.5 * rng.normal(size=(q, d)).astype(np.float32)
    return np.ascontiguousarray(table), np.ascontiguousarray(queries.astype(np.float32))


def from_model(directory: str, q: int) -> tuple[np.ndarray, np.ndarray]:
    from eae_model.checkpoint import load_model

    table = load_model(directory).entity_table.weight.detach().float().numpy()
    rng = np.random.default_rng(0)
    queries = table[rng.integers(0, len(table), q)]
    queries = queries + 0.5 * queries.std() * rng.normal(size=queries.shape).astype(np.float32)
    return np.ascontiguousarray(table), np.ascontiguousarray(queries)


def recall(ids: np.ndarray, exact: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(ids, exact)]))


def main() -> int:
    from eae_platform.serving.index import EntityIndex, IndexConfig

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entities", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--model", help="use this model's entity table instead of a synthetic one")
    p.add_argument("--k", type=int, nargs="+", default=[1, 10, 100])
    args = p.parse_args()
    table, queries = from_model(args.model, args.queries) if args.model else synthetic(args.entities, args.dim, args.queries)
    n, d = table.shape
    kmax = max(args.k)
    print(f"table {n:,} x {d}, {len(queries):,} queries, k = {args.k}")
    setups = [("flat", IndexConfig(kind="flat", use_gpu=False), {})]
    setups += [(f"ivf nprobe={p}", IndexConfig(kind="ivf", nprobe=p), {}) for p in (8, 32, 128)]
    setups += [(f"hnsw ef={e}", IndexConfig(kind="hnsw", ef_search=e), {}) for e in (64, 256)]
    rows, exact, built = [], None, {}
    print(f"{'index':<18} {'build s':>8} {'queries/s':>10} " + " ".join(f"{'R@' + str(k):>7}" for k in args.k))
    for name, config, _ in setups:
        kind_key = (config.kind,)
        t0 = time.perf_counter()
        if kind_key in built:  # same index, another search setting
            index = built[kind_key]
            if config.kind == "ivf":
                index.index.nprobe = config.nprobe
            else:
                index.index.hnsw.efSearch = config.ef_search
            build_s = 0.0
        else:
            index = EntityIndex(table, config)
            build_s = time.perf_counter() - t0
            built[kind_key] = index
        t0 = time.perf_counter()
        _, ids = index.search(queries, kmax)
        qps = len(queries) / (time.perf_counter() - t0)
        if exact is None:
            exact = ids
        recalls = {k: recall(ids, exact, k) for k in args.k}
        rows.append({"index": name, "build_s": build_s, "queries_per_s": qps, **{f"recall@{k}": r for k, r in recalls.items()}})
        print(f"{name:<18} {build_s:>8.1f} {qps:>10.0f} " + " ".join(f"{recalls[k]:>7.3f}" for k in args.k), flush=True)
    print(json.dumps({"entities": n, "dim": d, "queries": len(queries), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
