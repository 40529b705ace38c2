"""Load on /v1/link (and /v1/answer) over loopback: p50/p99 latency and throughput at
concurrency 1, 8 and 32, with dynamic batching on and off, then a replica killed mid-load
(failed requests counted). Baseline in the same run: the engine in-process (no Ray, no HTTP),
one text per forward pass and 16 per pass. Bounded: about 2 minutes on 2 cores.

    .venv/bin/python benchmarks/bench_serve.py [--preset tiny] [--set k=v ...] [--seconds 6]

The model has random weights (speed does not depend on them): the preset with overrides,
e.g. `--preset paper --set num_entities=100000` for BERT-base with a 100k-entity table.

On a GPU machine (docs/serving.md § GPU retrieval has the figures), one replica on the GPU,
where the memory's top-k and the candidates come from the exact top-k kernel, against one
replica on the CPU path (faiss) with every core:

    bench_serve.py --preset paper --device cuda --cpus-per-replica 4 --endpoints link answer \
        --batching on --no-kill --num-cpus 16
    bench_serve.py --preset paper --device cpu --cpus-per-replica 16 --endpoints link answer \
        --batching on --no-kill --num-cpus 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import torch

TEXTS = [
    "Ada Lovelace worked with Charles Babbage on the Analytical Engine in London.",
    "The Danube flows through Vienna, Budapest and Belgrade before it reaches the Black Sea.",
    "Marie Curie was born in Warsaw and studied at the University of Paris, where she met Pierre Curie.",
    "Akira Kurosawa directed Seven Samurai, which was released by Toho in 1954.",
    "The novel Things Fall Apart by Chinua Achebe is set in a village in Nigeria.",
    "Google was founded by Larry Page and Sergey Brin while they were students at Stanford University.",
]
QUESTIONS = [
    "Who designed the Analytical Engine?",
    "Which river flows through Vienna and Budapest?",
    "Where was Marie Curie born?",
    "Who directed Seven Samurai?",
    "Who wrote Things Fall Apart?",
    "Which university did Larry Page attend?",
]


def body(endpoint: str, i: int) -> dict:
    if endpoint == "answer":
        return {"question": QUESTIONS[i % len(QUESTIONS)], "top_k": 3}
    return {"text": TEXTS[i % len(TEXTS)], "top_k": 3}


def make_model(directory: Path, preset: str, overrides: list[str]) -> Path:
    from eae_model.checkpoint import save_model
    from eae_model.config import load_config
    from eae_model.model import EaEModel

    torch.manual_seed(0)
    model = EaEModel(load_config(preset, overrides=overrides))
    return save_model(model, directory)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def load(url: str, concurrency: int, seconds: float, on_tick=None, endpoint: str = "link") -> dict:
    """`concurrency` clients, each sending its next request to /v1/<endpoint> when the last one
    is answered."""
    latencies, failures, statuses = [], 0, {}
    deadline = time.monotonic() + seconds
    started = time.monotonic()

    async def client(n: int, session: aiohttp.ClientSession) -> None:
        nonlocal failures
        i = n
        while time.monotonic() < deadline:
            request = body(endpoint, i)
            i += concurrency
            t0 = time.perf_counter()
            try:
                async with session.post(f"{url}/v1/{endpoint}", json=request) as r:
                    await r.read()
                    status = r.status
            except aiohttp.ClientError as exc:
                status = type(exc).__name__
            if status == 200:
                latencies.append(time.perf_counter() - t0)
            else:
                failures += 1
                statuses[str(status)] = statuses.get(str(status), 0) + 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        tasks = [asyncio.create_task(client(n, session)) for n in range(concurrency)]
        if on_tick is not None:
            tasks.append(asyncio.create_task(on_tick()))
        await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    ok = len(latencies)
    return {"endpoint": endpoint, "concurrency": concurrency, "ok": ok, "failed": failures, "failures": statuses,
            "throughput_rps": ok / elapsed,
            "p50_ms": 1000 * percentile(latencies, 0.5) if ok else None,
            "p99_ms": 1000 * percentile(latencies, 0.99) if ok else None}


def wait_ready(url: str, timeout: float = 180) -> float:
    import urllib.request

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
                if r.status == 200:
                    # every replica: a few requests, so none is still loading when timing starts
                    for i in range(2 * len(TEXTS)):
                        for endpoint in ("link", "answer"):
                            req = urllib.request.Request(f"{url}/v1/{endpoint}", json.dumps(body(endpoint, i)).encode(),
                                                         {"Content-Type": "application/json"})
                            urllib.request.urlopen(req, timeout=60).read()
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready in {timeout} s")


def in_process_baseline(model_dir: Path, seconds: float, device: str, endpoints: list[str]) -> dict:
    from eae_platform.serving.engine import Engine
    from eae_platform.serving.model_source import resolve

    t0 = time.monotonic()
    engine = Engine(resolve(str(model_dir)), device=device)
    out = {"index": engine.describe()["index"], "engine_load_s": time.monotonic() - t0}
    for endpoint in endpoints:
        for batch in (1, 16):
            jobs = [engine.prepare(engine.link_job(TEXTS[i % len(TEXTS)], None, 3) if endpoint == "link"
                                   else engine.answer_job(QUESTIONS[i % len(QUESTIONS)], 3)) for i in range(batch)]
            engine.run(jobs)  # warm-up
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < seconds / 2:
                engine.run(jobs)
                n += batch
            out[f"{endpoint}_batch_{batch}_per_s"] = n / (time.monotonic() - t0)
    del engine
    if device == "cuda":
        torch.cuda.empty_cache()  # the replica loads its own copy
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--seconds", type=float, default=6.0, help="per load level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--kill-seconds", type=float, default=15.0)
    parser.add_argument("--no-kill", action="store_true", help="skip the killed-replica phase")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the replica runs")
    parser.add_argument("--cpus-per-replica", type=float, default=1.0, help="also the replica's torch threads")
    parser.add_argument("--num-cpus", type=int, default=2, help="the local Ray cluster's CPUs")
    parser.add_argument("--endpoints", nargs="+", choices=("link", "answer"), default=["link"])
    parser.add_argument("--batching", nargs="+", choices=("on", "off"), default=["on", "off"])
    args = parser.parse_args()
    threads = max(1, round(args.cpus_per_replica))

    import logging

    import ray
    from ray import serve

    from eae_platform.serving.app import build_app

    # Serve's driver-side INFO lines ("Deleting app", "Connecting to existing Serve app ... will
    # not be applied", "Application ... is ready") came between the phases' tables: kept at
    # WARNING, as `eae serve` keeps them without --verbose
    logging.getLogger("ray.serve").setLevel(logging.WARNING)

    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    t0 = time.monotonic()
    model_dir = make_model(tmp / "model", args.preset, args.set)
    print(f"model made and saved in {time.monotonic() - t0:.0f} s", flush=True)
    torch.set_num_threads(threads)
    baseline = in_process_baseline(model_dir, args.seconds, args.device, args.endpoints)
    torch.set_num_threads(2)
    print(f"model: preset {' '.join([args.preset, *args.set])} on {args.device}, index {baseline['index']}, engine loaded in "
          f"{baseline['engine_load_s']:.1f} s", flush=True)
    for endpoint in args.endpoints:
        print(f"in-process engine /v1/{endpoint}, {threads} thread(s): {baseline[f'{endpoint}_batch_1_per_s']:.1f} "
              f"requests/s one per pass, {baseline[f'{endpoint}_batch_16_per_s']:.1f} requests/s 16 per pass", flush=True)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    rows = []
    gpus = 1.0 if args.device == "cuda" else 0.0
    try:
        for batching in (b == "on" for b in args.batching):
            settings = {"model": str(model_dir), "batching": batching, "max_batch_size": 16,
                        "batch_wait_timeout_s": 0.005, "cpus_per_replica": args.cpus_per_replica,
                        "gpus_per_replica": gpus, "engine": {"num_threads": threads}}
            serve.delete("bench")  # a fresh app per phase: no rolling update competing for the cores
            serve.run(build_app(settings), name="bench", route_prefix="/", blocking=False)
            ready = wait_ready(url)
            print(f"\nbatching {'on' if batching else 'off'} (1 replica, {args.cpus_per_replica:g} CPU, {gpus:g} GPU, "
                  f"max_batch_size 16): ready in {ready:.1f} s", flush=True)
            print(f"{'endpoint':>9} {'concurrency':>11} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'ok':>6} {'failed':>6}")
            for endpoint in args.endpoints:
                for c in args.concurrency:
                    r = asyncio.run(load(url, c, args.seconds, endpoint=endpoint))
                    rows.append({"batching": batching, **r})
                    print(f"{endpoint:>9} {c:>11} {r['throughput_rps']:>8.1f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
                          f"{r['ok']:>6} {r['failed']:>6}", flush=True)

        if not args.no_kill:
            # A replica killed mid-load: 2 replicas, concurrency 8, one killed after a third of the time.
            settings = {"model": str(model_dir), "num_replicas": 2, "cpus_per_replica": 0.5, "engine": {"num_threads": 1}}
            serve.delete("bench")
            serve.run(build_app(settings), name="bench", route_prefix="/", blocking=False)
            wait_ready(url)
            killed = {}

            def replicas() -> list[str]:
                return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                              if a["name"].startswith("SERVE_REPLICA::bench#EaEModelServer"))

            async def kill_one() -> None:
                await asyncio.sleep(args.kill_seconds / 3)
                names = replicas()
                ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
                killed.update(name=names[0], at=time.monotonic())
                while True:  # until a replacement is running
                    await asyncio.sleep(0.5)
                    now = replicas()
                    if len(now) == 2 and names[0] not in now:
                        killed["replaced_after_s"] = time.monotonic() - killed["at"]
                        return

            r = asyncio.run(load(url, 8, args.kill_seconds, on_tick=kill_one))
            print(f"\nreplica killed mid-load (2 replicas, concurrency 8, {args.kill_seconds:.0f} s): {r['ok']} ok, "
                  f"{r['failed']} failed {r['failures'] or ''}, {r['throughput_rps']:.1f} req/s, p50 {r['p50_ms']:.1f} ms, "
                  f"p99 {r['p99_ms']:.1f} ms; replacement replica up {killed.get('replaced_after_s', float('nan')):.1f} s after the kill")
            rows.append({"kill": True, **r, "replaced_after_s": killed.get("replaced_after_s")})
    finally:
        # the local cluster ends with it, Serve's controller, proxy and replicas too, as `eae serve`'s
        # does (serving/cli.py). Not serve.shutdown: its controller kills itself while its
        # graceful_shutdown task waits, and Ray printed "Task ServeController.graceful_shutdown
        # failed ... killed by `ray.kill`" as the benchmark's last line.
        ray.shutdown()
    print("\n" + json.dumps({"baseline": baseline, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
