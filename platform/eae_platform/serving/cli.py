"""`eae serve` and `eae entities add` (argument parsing lives in eae_platform.cli)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from eae_model.config import parse_override
from eae_platform.progress import verbose
from eae_platform.serving.model_source import check_local


def load_settings(config: str | None, overrides: list[str]) -> dict[str, Any]:
    """Settings as a dict: a YAML file (a Serve config, whose first application's `args` are
    taken, or the settings themselves), then `key=value` overrides (dotted keys for nested
    sections: engine.index.kind=ivf)."""
    settings: dict[str, Any] = {}
    if config:
        if not Path(config).is_file():  # read_text's own words named neither the flag nor what it wants
            raise FileNotFoundError(f"--config {config}: no such file (a Serve config such as serve_apps/eae.yaml, "
                                    "or a YAML of settings)")
        data = yaml.safe_load(Path(config).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{config}: expected a mapping at the top level")
        apps = data.get("applications")
        settings = dict(apps[0].get("args") or {}) if apps else data
    for text in overrides:
        key, value = parse_override(text)
        node = settings
        *parents, leaf = key.split(".")
        for name in parents:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {key!r}: {name} is not a section")
        node[leaf] = value
    return settings


def _absolute(path: str | None) -> str | None:
    """Local paths made absolute: replicas run in other working directories."""
    if path is None or path.startswith("models:/") or "://" in path:
        return path
    return str(Path(path).expanduser().resolve())


def serve_settings(args: argparse.Namespace):
    from eae_platform.serving.app import ServeSettings
    from eae_platform.tracking import tracking_uri

    s = load_settings(args.config, args.set)
    flags = {"model": args.model, "entities": args.entities, "num_replicas": args.replicas}
    s.update({k: v for k, v in flags.items() if v is not None})
    if args.no_batching:
        s["batching"] = False
    engine = s.setdefault("engine", {})
    if not isinstance(engine, dict):  # engine.KEY below would be an AttributeError and a traceback file
        raise ValueError(f"engine must be a mapping of settings (engine.KEY=VALUE), got {engine!r}")
    if args.entity_store:
        engine["entity_store"] = args.entity_store
    if args.index:
        engine.setdefault("index", {})["kind"] = args.index
    if not s.get("model"):
        raise ValueError("--model is required (or a --config naming one)")
    s["model"], s["entities"] = _absolute(s["model"]), _absolute(s.get("entities"))
    engine["entity_store"] = _absolute(engine.get("entity_store"))
    if not s["model"].startswith("models:/") and "://" not in s["model"]:
        # the replica's checks (no model there, --entities of another vocabulary), made before
        # starting Ray: a replica made them ~20 s later, after Ray started, and exited 1
        check_local(s["model"], s.get("entities"))
    if s["model"].startswith("models:/") and not s.get("mlflow_uri"):
        s["mlflow_uri"] = tracking_uri()  # resolved here: ./mlflow.db means this directory
    if s["model"].startswith("models:/") and s["mlflow_uri"].startswith("sqlite:"):
        # a local store: a model it does not hold is refused here, not by a replica ~20 s after
        # Ray started (a server's store may be one only the cluster reaches: left to the replica)
        from eae_platform.tracking import check_registered, sqlite_path

        store = sqlite_path(s["mlflow_uri"])
        if store and not store.is_file():  # MLflow would make an empty one
            raise LookupError(f"{s['model']}: no MLflow store at {store} (MLFLOW_TRACKING_URI, else ./mlflow.db "
                              "of the current directory)")
        check_registered(s["model"], s["mlflow_uri"])
    return ServeSettings.from_args(s)


def check_port_free(host: str, port: int) -> None:
    """A new local cluster's Serve proxy binds host:port after Ray has started (~15 s), and a
    port in use then fails deep in Ray ("Failed to bind to address"): checked first, with the
    option that moves it. SO_REUSEADDR as uvicorn binds, so a closed socket's TIME_WAIT is free."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:  # e.g. an address of no interface here: not "in use"
                raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror}): give --host an address "
                                 f"of this machine (127.0.0.1, or 0.0.0.0 for all)") from None
            raise ValueError(f"{host}:{port} is in use ({exc.strerror}): another server? give --port "
                             f"(and --host) for another address") from None


def serve_command(args: argparse.Namespace) -> int:
    import dataclasses

    from ray import serve

    from eae_platform.ray_session import connect
    from eae_platform.serving.app import build_app

    settings = serve_settings(args)
    if not (args.address or os.environ.get("RAY_ADDRESS")):  # a running cluster's proxy may hold it already
        check_port_free(args.host, args.port)
    connect(args.address)
    # Serve's INFO lines as it starts (with --verbose only): three lines before ours, one of them
    # "Connecting to existing Serve app ... New http_options/controller_options will not be
    # applied", serve.run's own start after ours, though ours applied them (the address below)
    with _serve_logs_at(logging.INFO if verbose() else logging.WARNING):
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_app(dataclasses.asdict(settings)), name="eae", route_prefix="/", blocking=False)
    url = f"http://{args.host}:{args.port}"
    print(f"serving {settings.model} at {url}/  (API docs {url}/docs); waiting for the model ...", flush=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5) as r:
                print(f"ready: {json.loads(r.read())['model']}", flush=True)
                break
        except urllib.error.HTTPError as exc:
            try:
                status = json.loads(exc.read() or b"{}")
            except ValueError:  # Serve's proxy in plain text: a 404 until it has the app's route
                status = {}
            if status.get("error") and "loading" not in status["error"]:
                print(f"eae: error: the model did not load: {status['error']}", file=sys.stderr)
                _remove_app(on_cluster=bool(args.address or os.environ.get("RAY_ADDRESS")))
                return 1
        except OSError:
            pass
        time.sleep(1)
    print("Ctrl-C (or SIGTERM) stops the server.", flush=True)
    stopped_by = []

    def stop(signum, frame):
        stopped_by.append(signum)
        if len(stopped_by) == 1:
            raise KeyboardInterrupt
        # a second signal while it stops (Ctrl-C pressed again; `timeout`, which sends SIGTERM to
        # the command and then to its group): noted, not raised again. Raised, it broke off the
        # stop wherever it was (Ray's shutdown at exit) with a KeyboardInterrupt traceback, and
        # the command died of the signal instead of exiting 0

    # SIGINT too: a shell starts background jobs with it ignored (`eae serve ... &`).
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    by = stopped_by[0] if stopped_by else signal.SIGINT
    on_cluster = bool(args.address or os.environ.get("RAY_ADDRESS"))
    if on_cluster or by == signal.SIGINT:
        _remove_app(on_cluster)
    # else SIGTERM, to a local cluster: no drain. Its GCS and raylet are in this process's group,
    # and a SIGTERM to the group (`kill -- -PGID`, `timeout`, a service manager's stop)
    # has ended them too: serve.shutdown then waited 30 s for a GCS that was gone. Ray's driver
    # itself answers SIGTERM by exiting, and its local cluster, Serve with it, ends with it.
    print(f"eae: serve stopped ({signal.Signals(by).name})", file=sys.stderr, flush=True)
    # and ignored from here to the process's end (Ray's shutdown at exit): Python puts back the
    # default handler of a signal it handled as it finalizes, and one more Ctrl-C then killed it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return 0


def _remove_app(on_cluster: bool) -> None:
    """The app gone as `eae serve` ends (stopped, or its model failed to load). On a cluster
    that outlives this command, Serve with it: its controller and proxies too. On this command's
    local cluster only the app: its replicas finish their requests in flight
    (app.SHUTDOWN_WAIT_LOOP_S), the controller and proxy end with the cluster (ray.shutdown at
    exit). Not serve.shutdown there: the controller kills itself while its graceful_shutdown
    task waits, and Ray printed "Task ServeController.graceful_shutdown failed ... killed by
    `ray.kill`". (Serve's INFO line "Deleting app ['eae']" left out: the caller's line says it.)"""
    from ray import serve

    if on_cluster:
        serve.shutdown()
        return
    with _serve_logs_at(logging.WARNING):
        serve.delete("eae")


@contextlib.contextmanager
def _serve_logs_at(level: int):
    """Ray Serve's driver-side logger at `level` for the block."""
    serve_logger = logging.getLogger("ray.serve")
    before = serve_logger.level
    serve_logger.setLevel(level)
    try:
        yield
    finally:
        serve_logger.setLevel(before)


def _new_entities(args: argparse.Namespace) -> list[dict]:
    if args.file:
        if not Path(args.file).is_file():  # read_text's own words name neither the flag nor the command
            raise FileNotFoundError(f"--file {args.file}: no such file (JSON lines of {{title, contexts, aliases?}})")
        lines = Path(args.file).read_text().splitlines()
        entities = []
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    entities.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{args.file}:{n}: not JSON ({exc.msg})") from None
        return entities
    if not args.title or not args.context:
        raise ValueError("give --title and at least one --context, or --file")
    return [{"title": args.title, "contexts": args.context, "aliases": args.alias}]


def entities_add_command(args: argparse.Namespace) -> int:
    entities = _new_entities(args)
    if args.url:
        # urllib names neither a missing scheme nor a dead port plainly ("unknown url type", URLError)
        if not args.url.startswith(("http://", "https://")):
            raise ValueError(f"--url {args.url}: give the server's address with its scheme, e.g. http://{args.url}")
        request = urllib.request.Request(f"{args.url.rstrip('/')}/v1/entities", method="POST",
                                         data=json.dumps({"entities": entities}).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as r:
                added = json.loads(r.read())["added"]
        except urllib.error.HTTPError as exc:
            raise ValueError(f"{args.url} refused: {json.loads(exc.read()).get('error')}") from None
        except urllib.error.URLError as exc:
            raise ValueError(f"--url {args.url}: no server answered ({exc.reason}); is `eae serve` running there?") from None
    else:
        from eae_platform.serving.engine import Engine, EngineConfig, RequestError
        from eae_platform.serving.model_source import resolve

        if not args.model or not args.entity_store:
            raise ValueError("offline, give --model and --entity-store (or --url of a running server)")
        engine = Engine(resolve(args.model, args.entities), EngineConfig(entity_store=args.entity_store))
        try:
            added = engine.add_entities(entities, save=True)
        except RequestError as exc:
            raise ValueError(str(exc)) from None
    for item in added:
        mentions = item["mentions"]
        print(f"added {item['title']!r} as entity {item['entity_id']} from {mentions} mention{'' if mentions == 1 else 's'}")
    if not args.url:
        print(f"saved to {args.entity_store}: `eae serve --model {args.model} --entity-store {args.entity_store}` serves them")
    return 0
