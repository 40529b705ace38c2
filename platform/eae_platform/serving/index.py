"""Top-k entity retrieval through faiss, by inner product (the model's score h . E_j).

kinds:
  flat   exact search: IndexFlatIP, on a GPU when faiss-gpu is installed and a GPU is visible;
         else, with a GPU, eae_model.kernels.exact_topk.tile_top_k (backend "triton": the fused Triton
         pass, no faiss-gpu needed; float32 rows, so IEEE float32 dots: IndexFlatIP's top-k)
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
import torch

KINDS = ("flat", "ivf", "hnsw")
BACKENDS = ("faiss", "triton")


@dataclass
class IndexConfig:
    kind: str = "flat"
    nlist: int | None = None  # ivf cells; default 4 * sqrt(N)
    nprobe: int = 16  # ivf cells searched per query
    hnsw_m: int = 32  # hnsw neighbours per node
    ef_search: int = 128  # hnsw candidates kept per query
    use_gpu: bool | None = None  # None: when faiss-gpu and a GPU are there (flat only)
    backend: str | None = None  # flat only: faiss or triton; None: triton on a GPU without faiss-gpu

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"index kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.backend not in (None, *BACKENDS):
            raise ValueError(f"index backend must be one of {', '.join(BACKENDS)} or null, got {self.backend!r}")
        if self.backend == "triton" and self.kind != "flat":
            raise ValueError("the triton backend is exact search: index kind flat only")
        if self.nprobe <= 0 or self.hnsw_m <= 0 or self.ef_search <= 0 or (self.nlist is not None and self.nlist <= 0):
            raise ValueError("nlist, nprobe, hnsw_m and ef_search must be positive")


def gpu_available() -> bool:
    """faiss-gpu installed and a GPU visible (False without faiss: the GPU machines lack it)."""
    try:
        import faiss
    except ImportError:
        return False
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _wants_gpu(device) -> bool:
    """device: where the engine's model runs ("cpu", "cuda"); None: a GPU when one is visible."""
    return torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"


def _triton_device(config: IndexConfig, device=None):
    """Where the triton backend runs, or None where it does not apply: asked for, it needs a
    GPU (or Triton's interpreter, CPU tests); by default it serves a flat index on a GPU when
    faiss-gpu is absent and use_gpu is not false."""
    from eae_model.kernels.fused_memory import triton_interpreted

    if config.backend == "triton":
        if _wants_gpu(device) and torch.cuda.is_available():
            return torch.device("cuda")
        if triton_interpreted():
            return torch.device("cpu")
        raise RuntimeError("index backend triton needs a GPU (or TRITON_INTERPRET=1)")
    if config.backend is None and config.kind == "flat" and config.use_gpu is not False and _wants_gpu(device):
        try:
            import triton  # noqa: F401
        except ImportError:
            return None
        return None if gpu_available() else torch.device("cuda")
    return None


class TritonFlatIndex:
    """IndexFlatIP's interface (ntotal, add, search) over float32 rows kept on the device,
    searched exactly by eae_model.kernels.exact_topk.tile_top_k."""

    def __init__(self, rows: np.ndarray, device):
        self.device = device
        self.rows = torch.from_numpy(rows).to(device)
        self.norm_max = 0.0  # max_j |E_j|, tile_top_k's error bound
        self._grow(self.rows)

    def _grow(self, new) -> None:
        if new.shape[0]:
            self.norm_max = max(self.norm_max, float(new.norm(dim=1).max()))

    @property
    def ntotal(self) -> int:
        return self.rows.shape[0]

    def add(self, rows: np.ndarray) -> None:
        new = torch.from_numpy(rows).to(self.device)
        self.rows = torch.cat([self.rows, new])
        self._grow(new)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, ids = self.search_tensor(torch.from_numpy(queries), k)
        return scores.cpu().numpy(), ids.cpu().numpy()

    def search_tensor(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """queries [M, d] (any device) -> (scores [M, k], ids [M, k]) on the index's device:
        the engine's GPU path, with no round trip through host memory."""
        from eae_model.kernels.exact_topk import tile_top_k

        q = queries.to(self.device, torch.float32)
        return tile_top_k(q, self.rows, k, row_norm_max=self.norm_max)


class EntityIndex:
    """faiss index over the rows of E ([N, d], float32). search(queries [M, d], k) ->
    (scores [M, k], ids [M, k]); k is clipped to N."""

    def __init__(self, entities: np.ndarray, config: IndexConfig | None = None, device=None):
        """device: where the engine's model runs ("cpu" or "cuda"; None: a GPU when one is
        visible); a GPU index only goes with a GPU model."""
        self.config = c = config or IndexConfig()
        entities = np.ascontiguousarray(entities, dtype=np.float32)
        n, d = entities.shape
        self.dim = d
        self.backend = "faiss"
        triton_device = _triton_device(c, device)
        if triton_device is not None:
            self.index, self.backend = TritonFlatIndex(entities, triton_device), "triton"
            self.device = "gpu" if triton_device.type == "cuda" else "cpu"
            return
        import faiss  # here, not above: the triton backend runs where faiss is not installed

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
        use_gpu = (_wants_gpu(device) and gpu_available()) if c.use_gpu is None else c.use_gpu
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

    @property
    def rows(self) -> torch.Tensor | None:
        """The triton backend's rows of E ([N, d], on its device); None for faiss, which keeps
        its own copy."""
        return self.index.rows if self.backend == "triton" else None

    def search_tensor(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """search() for torch queries [M, d]; the results are on the queries' device. The triton
        backend searches them where they are (a GPU model's queries never visit the host)."""
        k = min(k, len(self))
        if self.backend == "triton" and queries.shape[0] and k:
            scores, ids = self.index.search_tensor(queries.reshape(-1, self.dim), k)
            return scores.to(queries.device), ids.to(queries.device)
        scores, ids = self.search(queries.detach().float().cpu().numpy(), k)
        return torch.from_numpy(scores).to(queries.device), torch.from_numpy(ids).to(queries.device)

    def describe(self) -> dict:
        c = self.config
        extra = {"ivf": {"nprobe": getattr(self.index, "nprobe", c.nprobe)}, "hnsw": {"ef_search": c.ef_search}}
        return {"kind": c.kind, "backend": self.backend, "device": self.device, "entities": len(self), "dim": self.dim,
                **extra.get(c.kind, {})}
