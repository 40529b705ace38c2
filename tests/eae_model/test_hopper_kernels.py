"""The Hopper top-k pass (eae_model.kernels.hopper_topk), without a GPU: Gluon has no interpreter,
so it is compiled for sm_90 here (Triton's own ptxas and cuobjdump) and its machine code is
checked for the schedule the kernel is written for. Its results are checked against the Triton
pass on a Hopper GPU (tests/gpu/test_hopper_topk.py, run by scripts/gpu/kernels)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from eae_model.kernels import hopper_topk as hk
from eae_model.kernels.triton_topk import tile_top2

REPO = Path(__file__).resolve().parents[2]

# Compiled in a process of its own: Triton's interpreter (on in CI, for the other kernels'
# tests) patches triton.language when it runs a kernel, which breaks Gluon's code generation in
# the same process; and with a cache of its own, so that every run compiles.
_COMPILE = """
import json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
from eae_model.kernels import hopper_topk as hk
from eae_model.kernels.common import TILE_ROWS
x = torch.zeros(1024, 256, dtype=torch.bfloat16)
sig = {"h_desc": mangle_type(hk.descriptor(x, hk.BLOCK_M // 2)), "e_desc": mangle_type(hk.descriptor(x, TILE_ROWS)),
       "TMAX": "*fp32", "TARG": "*i32", "TSEC": "*fp32", "M": "i32", "N": "i32", "NT": "i32", "ROWS": "i32",
       "MODE": "constexpr", "STAGES": "constexpr", "num_warps": "constexpr"}
src = GluonASTSource(hk._tile_top2_kernel, sig, constexprs={"MODE": 2, "STAGES": hk.STAGES, "num_warps": 4})
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
open(sys.argv[1], "wb").write(kernel.asm["cubin"])
print(json.dumps({"shared": kernel.metadata.shared}))
"""


@pytest.fixture(scope="module")
def sass(tmp_path_factory):
    """The kernel's SASS for a 256-d bf16 table, MODE 2."""
    tmp = tmp_path_factory.mktemp("sm90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp / "cache"), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(tmp / "pass.cubin")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["shared"] <= 227 * 1024  # fits an H100's shared memory
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return subprocess.run([str(cuobjdump), "-sass", str(tmp / "pass.cubin")], capture_output=True, text=True,
                          check=True).stdout


def test_each_warpgroup_issues_a_tiles_wgmma_at_once_then_waits(sass):
    ops = [m.group(1) for m in re.finditer(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)]
    regions = []  # from each first wgmma to the wait after it: the ops in between
    i = 0
    while i < len(ops):
        if ops[i].startswith("HGMMA"):
            j = ops.index("WARPGROUP.DEPBAR.LE", i)
            regions.append(ops[i:j])
            i = j
        i += 1
    # Two consumers, each: one tile's 16 wgmma steps (256 / k16), with nothing of the reduction
    # of scores (float compares and maxima, shuffles, stores) between them and the wait (index
    # arithmetic for the mask may be): ptxas spreading the wgmmas through the reduction would
    # undo the ping-pong (measured: 16.8 ms against 13.9).
    assert [sum(op.startswith("HGMMA") for op in r) for r in regions] == [16, 16]
    reduction = re.compile(r"^(FMNMX|FSETP|SHFL|STG)")
    assert not [op for r in regions for op in r if reduction.match(op)]


def test_the_reduction_takes_four_ops_a_score(sass):
    # Per score: one LOP3 making its key (each consumer's 64 scores a thread, in one
    # instruction each) and three FMNMX (best; min and max for the second-best), plus a few for
    # the shuffles across lanes; no compares and selects tracking a column (there were seven
    # ops a score, and the pass took 13.9-15.1 ms against the best-score-only pass's 11.1).
    # (LUT 0xea: (score & 0xffffff80) | column; 0xf8 would be score | (0xffffff80 & column).)
    assert len(re.findall(r"LOP3\.LUT R\d+, R\d+, 0xffffff80, R\d+(?:\.reuse)?, 0xea", sass)) == 2 * 64
    assert len(re.findall(r"\bFMNMX", sass)) <= 2 * (3 * 64 + 16)
    assert not re.search(r"\b(FSETP|SEL)\b", sass)


def test_partitions_get_their_own_register_budgets(sass):
    # warp specialisation: the loader gives registers back, each consumer takes 232
    assert "USETMAXREG.DEALLOC" in sass and "USETMAXREG.TRY_ALLOC" in sass


def test_cpu_tensors_are_refused_by_the_hopper_pass():
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    assert not hk.supported(x, x)
    with pytest.raises(ValueError, match="Hopper GPU"):
        tile_top2(x, x, kernel="hopper")
    with pytest.raises(ValueError, match="kernel must be"):
        tile_top2(x, x, kernel="wgmma")
