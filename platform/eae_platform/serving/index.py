"""Top-k entity retrieval through faiss, by inner product (the model's score h . E_j).

kinds:
  flat   exact search (IndexFlatIP); on a GPU when faiss-gpu is installed and a GPU is visible
  ivf    approximate: an inverted file of `nlist` k-means cells, `nprobe` of them searched
  hnsw   approximate: a graph of `hnsw_m` neighbours per node, `ef_search` candidates per query
`benchmarks/bench_retrieval.py` prints each kind's recall@k against flat.

Rows can be appended (new entities) without rebuilding: faiss assigns them ids N, N+1, ...
An IVF index keeps its trained centroids (new rows go to their nearest cell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

KINDS = ("flat", "ivf", "hnsw")


@dataclass
class IndexConfig:
    kind: str = "flat"
    nlist: int | None = None  # ivf cells; default 4 * sqrt(N)
    nprobe: int = 16  # ivf cells searched per query
    hnsw_m: int = 32  # hnsw neighbours per node
    ef_search: int = 128  # hnsw candidates kept per query
    use_gpu: bool | None = None  # None: when faiss-gpu and a GPU are there (flat only)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"index kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.nprobe <= 0 or self.hnsw_m <= 0 or self.ef_search <= 0 or (self.nlist is not None and self.nlist <= 0):
            raise ValueError("nlist, nprobe, hnsw_m and ef_search must be positive")


def gpu_available() -> bool:
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class EntityIndex:
    """faiss index over the rows of E ([N, d], float32). search(queries [M, d], k) ->
    (scores [M, k], ids [M, k]); k is clipped to N."""

    def __init__(self, entities: np.ndarray, config: IndexConfig | None = None):
        import faiss

        self.config = c = config or IndexConfig()
        entities = np.ascontiguousarray(entities, dtype=np.float32)
        n, d = entities.shape
        self.dim = d
        if c.kind == "flat":
            index = faiss.IndexFlatIP(d)
        elif c.kind == "ivf":
            nlist = min(c.nlist or max(1, int(4 * math.sqrt(n))), n)
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
            index.train(entities)
            index.nprobe = min(c.nprobe, nlist)
        else:
            index = faiss.IndexHNSWFlat(d, c.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = c.ef_search
        index.add(entities)
        self.device = "cpu"
        use_gpu = gpu_available() if c.use_gpu is None else c.use_gpu
        if use_gpu and c.kind == "flat":
            if not gpu_available():
                raise RuntimeError("use_gpu: faiss-gpu and a visible GPU are needed (pip install '.[gpu]')")
            self._resources = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self._resources, 0, index)
            self.device = "gpu"
        self.index = index

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def add(self, rows: np.ndarray) -> None:
        """Append rows [n, d]; they get the next ids."""
        self.index.add(np.ascontiguousarray(rows, dtype=np.float32).reshape(-1, self.dim))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        k = min(k, len(self))
        if queries.shape[0] == 0 or k == 0:
            return np.zeros((queries.shape[0], k), np.float32), np.zeros((queries.shape[0], k), np.int64)
        scores, ids = self.index.search(queries, k)
        return scores, ids

    def describe(self) -> dict:
        c = self.config
        extra = {"ivf": {"nprobe": getattr(self.index, "nprobe", c.nprobe)}, "hnsw": {"ef_search": c.ef_search}}
        return {"kind": c.kind, "device": self.device, "entities": len(self), "dim": self.dim, **extra.get(c.kind, {})}
