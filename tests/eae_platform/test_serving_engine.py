"""The serving engine without Ray: windows and character offsets, batching that changes no
answer, faiss retrieval against exact search, new entities and their store, model sources,
`eae entities add`."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from eae_platform.cli import main
from eae_platform.serving.engine import Engine, EngineConfig, RequestError, parse_spans
from eae_platform.serving.index import EntityIndex, IndexConfig
from eae_platform.serving.model_source import resolve, titles_corpus
from tests.eae_platform.serving_fixtures import aliases, make_model_dir, title

REPO = Path(__file__).resolve().parents[2]

WORDS = "the river flows past old mills and quiet towns where people trade grain and wool".split()


@pytest.fixture(autouse=True)
def one_thread():
    """Ops this small gain nothing from two threads, and on a busy 2-core machine intra-op
    threads make them many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("serve-model") / "model", max_length=32)


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine(resolve(str(model_dir)))


def long_text(n_words: int) -> str:
    rng = np.random.default_rng(0)
    return " ".join(rng.choice(WORDS, n_words)) + "."


def test_long_text_windows_keep_offsets_and_spans(engine):
    text = long_text(200)  # ~200 wordpieces: 7+ windows of 30
    starts = [m.start() for m in re.finditer(r"\bmills\b", text)]
    spans = [[s, 5] for s in starts]
    assert len(spans) >= 5
    out = engine.link(text, spans, top_k=3)
    assert [(m["start"], m["end"]) for m in out["mentions"]] == [(s, s + 5) for s, _ in spans]
    for m in out["mentions"]:
        assert m["text"] == "mills" and len(m["candidates"]) == 3
        assert m["title"] == title(m["entity_id"])
        scores = [c["score"] for c in m["candidates"]]
        assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1
    detected = engine.link(text)["mentions"]
    assert detected, "the random BIO head decodes some mentions"
    for m in detected:
        assert text[m["start"]:m["end"]] == m["text"] and m["start"] < m["end"]
    assert all(a["end"] <= b["start"] for a, b in zip(detected, detected[1:]))


def test_batched_answers_equal_single_ones(engine):
    jobs = [engine.link_job(long_text(n)) for n in (5, 40, 90)]
    jobs.append(engine.link_job("quiet towns trade wool", [[0, 5], [13, 5]], 4))
    jobs.append(engine.answer_job("Where do people trade grain?", 3))
    together = engine.run([engine.prepare(j) for j in jobs])
    for job, batched in zip(jobs, together):
        alone = engine.run([engine.prepare(job)])[0]
        key = "mentions" if "mentions" in alone else "answers"
        assert len(batched[key]) == len(alone[key])
        for a, b in zip(alone[key], batched[key]):
            assert a["entity_id"] == b["entity_id"] and a.get("start") == b.get("start")
            assert a["score"] == pytest.approx(b["score"], abs=1e-5)


def test_answer_position_is_not_a_question_mention(engine):
    out = engine.answer("Which river flows past the old mills?", top_k=4)
    assert len(out["answers"]) == 4 and len({a["entity_id"] for a in out["answers"]}) == 4
    q = out["question"]
    for m in out["question_entities"]:
        assert q[m["start"]:m["end"]] == m["text"]


@pytest.mark.parametrize("spans, message", [
    ([[0, 3], [2, 3]], "overlap"),
    ([[-1, 2]], "not inside"),
    ([[0, 0]], "not inside"),
    ([[5, 100]], "not inside"),
    ([[3, 1]], "whitespace"),
    ([[0, 1.5]], "pair of integers"),
    ([[0, True]], "pair of integers"),
    ("0,3", "list"),
])  # fmt: skip
def test_bad_spans_are_refused_with_a_reason(spans, message):
    with pytest.raises(RequestError, match=message):
        parse_spans(spans, "abc def ghi", 10)


def test_bad_text_and_top_k(engine):
    for text, top_k, status, message in [("", None, 400, "empty"), ("  \n", None, 400, "empty"),
                                         (5, None, 400, "string"), ("x" * 10_001, None, 413, "limit"),
                                         ("ok", 0, 400, "between"), ("ok", 101, 400, "between"),
                                         ("ok", "3", 400, "integer")]:
        with pytest.raises(RequestError, match=message) as caught:
            engine.link_job(text, None, top_k)
        assert caught.value.status == status


def test_text_with_an_unpaired_surrogate_is_refused(model_dir):
    """JSON may escape half a UTF-16 pair ("\\ud800"); the string it decodes to cannot be
    encoded as UTF-8, so the tokenizer raised TypeError (HTTP 500) and an added title with one
    broke every later answer that named it: a 400 that says where, before anything is added."""
    engine = Engine(resolve(str(model_dir)))  # its own: a wrongly added entity must not reach other tests
    for call in (lambda: engine.link_job("The river \ud800 flows."),
                 lambda: engine.answer_job("Who \udc00?"),
                 lambda: engine.add_entities([{"title": "Ada \ud800", "contexts": [{"text": "Ada Q", "spans": [[0, 3]]}]}]),
                 lambda: engine.add_entities([{"title": "Ada Quill", "aliases": ["Q\ud83d"], "contexts": ["Ada Quill."]}]),
                 lambda: engine.add_entities([{"title": "Ada Quill", "contexts": ["Ada Quill \ud800."]}])):
        with pytest.raises(RequestError, match="unpaired surrogate") as caught:
            call()
        assert caught.value.status == 400
    assert engine.table.num_entities == 512
    assert engine.link_job(json.loads('"a pair \\ud83d\\ude00 is one character"')).text[7] == "\U0001F600"


def test_an_unsaved_entity_is_refused_where_a_store_numbers_them(model_dir, tmp_path):
    """With an entity store, row i of the store is entity base + i on every replica; an entity
    added with save=False took an id the store would give another, which that replica then never
    loaded, and its next saved addition wrote the unsaved one over it."""
    config = EngineConfig(entity_store=str(tmp_path / "store"))
    a, b = Engine(resolve(str(model_dir)), config), Engine(resolve(str(model_dir)), config)
    with pytest.raises(RequestError, match="save: false") as caught:
        a.add_entities([{"title": "Temp Mill", "contexts": ["The Temp Mill is new."]}], save=False)
    assert caught.value.status == 400 and a.table.num_entities == 512
    b.add_entities([{"title": "Old Mill", "contexts": ["The Old Mill stands by the river."]}])
    assert a.add_entities([{"title": "New Mill", "contexts": ["The New Mill is quiet."]}])[0]["entity_id"] == 513
    assert json.loads((tmp_path / "store" / "added-entities.json").read_text())["titles"] == ["Old Mill", "New Mill"]


def test_a_store_title_with_an_unpaired_surrogate_is_repaired_at_load(model_dir, tmp_path):
    """A title saved before such titles were refused: loaded as it was, it failed every response
    that named it (500s on most links, since an added entity is often a candidate)."""
    config = EngineConfig(entity_store=str(tmp_path / "store"))
    Engine(resolve(str(model_dir)), config).add_entities([{"title": "Old Mill", "contexts": ["The Old Mill is old."]}])
    meta_path = tmp_path / "store" / "added-entities.json"
    meta = json.loads(meta_path.read_text())
    meta["titles"] = ["Old\ud800Mill"]
    meta_path.write_text(json.dumps(meta))  # json.dumps escapes it as the old engine did
    engine = Engine(resolve(str(model_dir)), config)
    assert engine.titles[512] == "Old\ufffdMill"
    json.dumps(engine.entity(512), ensure_ascii=False).encode("utf-8")  # as the HTTP response encodes it


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_faiss_index_against_exact_search(kind):
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(50, 32)).astype(np.float32)
    table = (centers[rng.integers(0, 50, 5000)] + 0.3 * rng.normal(size=(5000, 32))).astype(np.float32)
    queries = (table[rng.integers(0, 5000, 200)] + 0.1 * rng.normal(size=(200, 32))).astype(np.float32)
    exact = torch.from_numpy(queries @ table.T).topk(10, dim=-1)
    index = EntityIndex(table, IndexConfig(kind=kind))
    scores, ids = index.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(), exact.indices.tolist())])
    if kind == "flat":
        assert recall == 1.0 and np.allclose(scores, exact.values.numpy(), atol=1e-4)
    else:
        assert recall >= 0.9, recall
    index.add(100 * queries[:3])  # new rows get the next ids and are found at once
    assert len(index) == 5003 and index.search(queries[2:3], 1)[1][0, 0] == 5002


def test_triton_flat_index_equals_faiss_flat():
    """The triton backend (tile_top_k; in CI through Triton's interpreter) answers as
    IndexFlatIP, also after rows are added; it is exact search only."""
    rng = np.random.default_rng(1)
    table = (0.05 * rng.normal(size=(5000, 32))).astype(np.float32)
    queries = rng.normal(size=(40, 32)).astype(np.float32)
    faiss_flat = EntityIndex(table, IndexConfig(kind="flat", backend="faiss"))
    ours = EntityIndex(table, IndexConfig(kind="flat", backend="triton"))
    assert ours.describe()["backend"] == "triton" and faiss_flat.describe()["backend"] == "faiss"
    for index in (faiss_flat, ours):
        index.add(queries[:2] * 0.05)
    (ws, wi), (gs, gi) = faiss_flat.search(queries, 10), ours.search(queries, 10)
    assert len(ours) == 5002 and np.array_equal(np.sort(gi, 1), np.sort(wi, 1))
    assert np.allclose(gs, ws, atol=1e-5) and (gi[:2, 0] == [5000, 5001]).all()
    with pytest.raises(ValueError, match="flat only"):
        IndexConfig(kind="ivf", backend="triton")
    with pytest.raises(ValueError, match="backend"):
        IndexConfig(backend="cuvs")


def test_new_entities_link_at_once_and_survive_a_restart(model_dir, tmp_path):
    store = tmp_path / "store"
    engine = Engine(resolve(str(model_dir)), EngineConfig(entity_store=str(store)))
    context = "Quentin Marsh founded the river mills in the old towns."
    added = engine.add_entities([
        {"title": "Quentin Marsh", "contexts": [context]},
        {"title": "Marsh Mills Ltd", "aliases": ["the mills"], "contexts": [{"text": "They sold the mills.", "spans": [[9, 10]]}]},
    ])  # fmt: skip
    assert [a["entity_id"] for a in added] == [512, 513] and [a["mentions"] for a in added] == [1, 1]
    first = engine.link(context, [[0, 13]], top_k=3)["mentions"][0]
    assert (first["entity_id"], first["title"]) == (512, "Quentin Marsh")
    with pytest.raises(RequestError, match="exists already") as caught:
        engine.add_entities([{"title": "Quentin Marsh", "contexts": [context]}])
    assert caught.value.status == 409
    with pytest.raises(RequestError, match="never names"):
        engine.add_entities([{"title": "Nobody", "contexts": ["a text without the name"]}])
    restarted = Engine(resolve(str(model_dir)), EngineConfig(entity_store=str(store)))
    assert restarted.table.num_entities == 514 and restarted.titles[512:] == ["Quentin Marsh", "Marsh Mills Ltd"]
    assert torch.equal(restarted.table.weight[512:], engine.table.weight[512:])
    again = restarted.link(context, [[0, 13]], top_k=3)["mentions"][0]
    assert again["entity_id"] == 512 and again["score"] == pytest.approx(first["score"], abs=1e-6)
    # the aliases given are the entity's, here and after the restart (they were dropped: [])
    for served in (engine, restarted):
        assert served.entity(513)["aliases"] == ["the mills"] and served.entity(512)["aliases"] == []
    meta = json.loads((store / "added-entities.json").read_text())
    del meta["aliases"]  # a store saved before aliases were kept still loads, without them
    (store / "added-entities.json").write_text(json.dumps(meta))
    assert Engine(resolve(str(model_dir)), EngineConfig(entity_store=str(store))).entity(513)["aliases"] == []


def test_entities_say_where_their_titles_come_from(engine, tmp_path):
    assert engine.describe()["titles_from"] == "wikipedia"  # recorded in entities.parquet, as `eae data build` does
    assert engine.entity(7) == {"entity_id": 7, "title": title(7), "source": "wikipedia", "aliases": aliases(7)}
    for bad in (512, -1, "7"):
        with pytest.raises(RequestError, match="no entity") as caught:
            engine.entity(bad)
        assert caught.value.status == 404
    world = Engine(resolve(str(make_model_dir(tmp_path / "world", max_length=32, corpus="synthetic"))))
    assert world.describe()["titles_from"] == "synthetic" and world.entity(3)["source"] == "synthetic"
    added = world.add_entities([{"title": "Ada Quill", "contexts": ["Ada Quill wrote about the river."]}], save=False)
    assert world.entity(added[0]["entity_id"]) == {"entity_id": 512, "title": "Ada Quill", "source": "added", "aliases": []}
    # a vocabulary that does not say: its data directory's manifest.json may; else it is unknown
    old = make_model_dir(tmp_path / "old", max_length=32, corpus=None)
    assert titles_corpus(old / "entities.parquet") is None
    (old / "manifest.json").write_text(json.dumps({"corpus": "synthetic"}))
    assert titles_corpus(old / "entities.parquet") == "synthetic" and titles_corpus(None) is None


def test_checkpoint_directory_and_store_for_another_model(model_dir, tmp_path):
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    shutil.copy(model_dir / "model.safetensors", ckpt)
    config = json.loads((model_dir / "config.json").read_text())
    (ckpt / "state.json").write_text(json.dumps({"step": 1, "config": {"model": config, "train": {"data": str(model_dir)}}}))
    engine = Engine(resolve(str(ckpt)))  # titles from the checkpoint's train.data
    assert engine.titles[7] == title(7)
    with pytest.raises(FileNotFoundError, match="neither a model directory"):
        resolve(str(tmp_path))
    store = tmp_path / "store"
    store.mkdir()
    (store / "added-entities.json").write_text(json.dumps({"base_entities": 99, "dim": 32, "titles": []}))
    with pytest.raises(ValueError, match="made for a table of 99"):
        Engine(resolve(str(model_dir)), EngineConfig(entity_store=str(store)))


def test_cli_entities_add_offline(model_dir, tmp_path, capsys):
    store = tmp_path / "store"
    argv = ["entities", "add", "--model", str(model_dir), "--entity-store", str(store), "--title", "Ada Quill",
            "--context", "Ada Quill wrote about the river.", "--context", "The poet Ada Quill lived by the mills."]
    assert main(argv) == 0
    assert "added 'Ada Quill' as entity 512 from 2 mentions" in capsys.readouterr().out
    assert main(argv) == 2  # the same title again: a clear error, no traceback
    assert "exists already" in capsys.readouterr().err
    assert json.loads((store / "added-entities.json").read_text())["titles"] == ["Ada Quill"]
    assert main(["entities", "add", "--model", str(model_dir), "--entity-store", str(store), "--title", "Bo Reed",
                 "--context", "Bo Reed sang."]) == 0
    assert "added 'Bo Reed' as entity 513 from 1 mention\n" in capsys.readouterr().out  # not '1 mentions'


def test_serve_settings_from_flags_and_the_deploy_config(model_dir, monkeypatch, tmp_path, capsys):
    from eae_platform.cli import build_parser
    from eae_platform.serving.cli import serve_settings

    monkeypatch.chdir(model_dir.parent)
    args = build_parser().parse_args(["serve", "--config", str(REPO / "serve_apps" / "eae.yaml"), "--model", "model",
                                      "--set", "engine.index.kind=hnsw", "--set", "max_batch_size=4",
                                      "--entity-store", "store", "--no-batching"])
    s = serve_settings(args)
    assert s.model == str(model_dir) and s.engine.entity_store == str(model_dir.parent / "store")
    assert s.engine.index.kind == "hnsw" and s.max_batch_size == 4 and not s.batching and s.mlflow_uri is None
    args = build_parser().parse_args(["serve", "--model", "models:/eae@pretrained"])
    assert (args.host, args.port) == ("127.0.0.1", 8000)  # this machine only, unless --host says otherwise
    with pytest.raises(LookupError, match=f"models:/eae@pretrained: no MLflow store at {model_dir.parent / 'mlflow.db'}"):
        serve_settings(args)  # resolved where the command runs, and checked there (no store: none made)
    assert not (model_dir.parent / "mlflow.db").exists()
    with pytest.raises(ValueError, match="--model is required"):
        serve_settings(build_parser().parse_args(["serve"]))
    assert main(["serve", "--model", str(tmp_path / "missing")]) == 2  # refused before Ray starts
    # a file where the model directory goes: the command says so (it said "no such directory" of a
    # path that is there), before Ray starts
    weights = model_dir / "model.safetensors"
    capsys.readouterr()
    assert main(["serve", "--model", str(weights)]) == 2
    assert capsys.readouterr().err == (f"eae: error: model {str(weights)!r}: is a file, not a model directory "
                                       "(expected models:/name@alias, an `eae pretrain --out` directory or a "
                                       "checkpoint directory)\n")


def test_serve_on_a_port_in_use_is_refused_before_ray_starts(model_dir, monkeypatch, capsys):
    """The proxy binds its port ~15 s after Ray starts; a busy one failed there, deep in Ray."""
    import socket

    import eae_platform.ray_session

    def no_ray(*args, **kwargs):  # this process may hold a cluster of another test's: ask, not ray.is_initialized()
        raise AssertionError("Ray was started")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(eae_platform.ray_session, "connect", no_ray)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--model", str(model_dir), "--port", str(port)]) == 2
    assert f"127.0.0.1:{port} is in use" in capsys.readouterr().err


def test_serve_of_a_models_uri_the_local_store_does_not_hold_is_refused_before_ray(tmp_path, monkeypatch, capsys):
    """models:/NAME@ALIAS that ./mlflow.db does not hold: a replica said so ~20 s after Ray had
    started, and Ray printed a line of its own. RAY_ADDRESS names a port nothing listens on: had
    the command gone on to Ray, it would have said that instead."""
    from eae_platform.tracking import mlflow_client

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}").search_registered_models()  # an empty store
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    capsys.readouterr()  # MLflow's lines as it made the store
    assert main(["serve", "--model", "models:/nope@pretrained"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eae: error: models:/nope@pretrained: Registered Model with name=nope not found in sqlite:")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["entities", "serve"])
def test_an_entity_store_that_is_a_file_is_one_clear_error(model_dir, tmp_path, monkeypatch, command, capsys):
    """--entity-store naming a file: NotADirectoryError at the store's first read and a
    traceback file. RAY_ADDRESS names a port nothing listens on: `eae serve` must refuse it first."""
    store = tmp_path / "store.json"
    store.write_text("{}")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    argv = (["entities", "add", "--title", "New Town", "--context", "New Town is a city."] if command == "entities"
            else ["serve"])
    assert main([*argv, "--model", str(model_dir), "--entity-store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"eae: error: entity store {store}: not a directory") and len(err.strip().splitlines()) == 1


def test_serve_config_that_is_not_there_names_the_flag(tmp_path, capsys):
    assert main(["serve", "--config", str(tmp_path / "nope.yaml"), "--set", "model=m"]) == 2
    assert capsys.readouterr().err == f"eae: error: --config {tmp_path / 'nope.yaml'}: no such file (a Serve config such as serve_apps/eae.yaml, or a YAML of settings)\n"


def test_serve_on_a_host_address_this_machine_lacks_is_not_said_to_be_in_use(model_dir, monkeypatch, capsys):
    """--host of no interface here: "is in use (Cannot assign requested address)" pointed at another server."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["serve", "--model", str(model_dir), "--host", "203.0.113.7", "--port", "8000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eae: error: cannot listen on 203.0.113.7:8000 (") and "in use" not in err


@pytest.mark.parametrize("setting, message", [
    ("engine.bogus=1", "eae: error: unknown engine settings: bogus (known: "),
    ("engine.index.bogus=1", "eae: error: unknown engine.index settings: bogus (known: "),
    ("engine=3", "eae: error: engine must be a mapping of settings (engine.KEY=VALUE), got 3"),
    ("engine.index=3", "eae: error: engine.index must be a mapping of settings, got 3"),
])
def test_serve_with_an_unknown_or_malformed_nested_setting_is_one_clear_error(model_dir, setting, message, capsys):
    """--set engine.KEY / engine.index.KEY that no setting has: a TypeError (or AttributeError)
    and a traceback file, where an unknown top-level key was one line naming the known ones."""
    assert main(["serve", "--model", str(model_dir), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1 and "traceback" not in err


@pytest.mark.parametrize("port", ["99999", "abc"])
def test_serve_on_a_port_outside_1_to_65535_is_refused_by_the_parser(model_dir, port, capsys):
    """--port 99999 was an OverflowError from bind() and a traceback file."""
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--model", str(model_dir), "--port", port])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "eae serve: error: argument --port: " in err and "Traceback" not in err and "traceback" not in err


def test_a_replica_takes_a_share_of_the_cluster_s_gpus_unless_told():
    """gpus_per_replica null (the default): the cluster's GPUs shared, at most one a replica;
    on CI's GPU-less cluster the CPU path (test_serve.py's replicas run so, /readyz says cpu)."""
    from eae_platform.serving.app import ServeSettings, replica_gpus

    assert replica_gpus(None, 0, 2) == 0.0
    assert replica_gpus(None, 1, 2) == 0.5 and replica_gpus(None, 1, 1) == 1.0
    assert replica_gpus(None, 8, 2) == 1.0  # a second GPU would sit idle under one model
    assert replica_gpus(0.0, 8, 1) == 0.0 and replica_gpus(0.25, 0, 1) == 0.25  # given: kept
    assert ServeSettings(model="m").gpus_per_replica is None
    with pytest.raises(ValueError, match="gpus_per_replica must be >= 0"):
        ServeSettings(model="m", gpus_per_replica=-1)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def registered(model_dir, tmp_path_factory):
    """(the model registered as models:/eae-serve-test@pretrained, its store's URI, what MLflow
    logged while registering it) in a SQLite store of its own."""
    from eae_platform.tracking import Tracker

    tmp = tmp_path_factory.mktemp("registered")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    logged = _Records()
    mlflow_logger = logging.getLogger("mlflow")  # MLflow's loggers do not propagate to the root
    mlflow_logger.addHandler(logged)
    try:
        tracker = Tracker("serve-test", uri=uri, spool_dir=tmp)
        model_uri = tracker.register_model(model_dir, "eae-serve-test", "pretrained")
        assert tracker.close().ok
    finally:
        mlflow_logger.removeHandler(logged)
    return model_uri, uri, logged.lines


def test_registered_mlflow_model_is_served_with_its_titles(registered, tmp_path):
    model_uri, uri, _ = registered
    engine = Engine(resolve(model_uri, mlflow_uri=uri, cache_dir=tmp_path / "cache"))
    assert engine.titles[11] == title(11) and engine.describe()["model"] == "models:/eae-serve-test@pretrained"
    assert engine.titles_from == "wikipedia" and engine.entity(11)["aliases"] == aliases(11)  # the vocabulary travels whole
    out = engine.link("the river flows past old mills", [[4, 5]], top_k=2)["mentions"][0]
    assert out["text"] == "river" and out["title"] == title(out["entity_id"])


def test_the_registered_model_loads_without_unpickling_and_links_as_the_engine(registered, engine, tmp_path,
                                                                              monkeypatch):
    """The pyfunc is a model from code (no pickle is written, MLflow's CloudPickle warning never
    comes, and it loads with MLflow's pickle loading switched off), and its predict is the
    engine's /v1/link: a text of many windows gets the same mentions, those past the first
    window included."""
    from eae_platform.tracking import load_pyfunc

    model_uri, uri, logged = registered
    assert not [line for line in logged if "pickle" in line.lower()], logged
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")  # MLflow refuses any pickle
    pyfunc = load_pyfunc(model_uri, uri=uri, dst_path=tmp_path / "pyfunc")
    assert not [p for p in (tmp_path / "pyfunc").rglob("*") if p.suffix in (".pkl", ".pickle", ".cloudpickle")]
    text = long_text(120)  # ~120 wordpieces: 4+ windows of 30
    first_window_ends = engine.tokenizer.encode(text, add_special_tokens=False).offsets[engine.window - 1][1]
    expected = engine.link(text)
    assert any(m["start"] >= first_window_ends for m in expected["mentions"]), "mentions past the first window"
    assert pyfunc.predict([text]) == [expected]
    assert pyfunc.predict({"text": text}) == pyfunc.predict(text) == [expected]
    both = [engine.prepare(engine.link_job(t)) for t in ("the river", text)]
    assert pyfunc.predict(["the river", text]) == engine.run(both)  # one batch, as Serve batches requests
    for wrong, got in (([{"text": text}], "a list holding a dict"), ({"texts": [text]}, "a mapping without 'text'"),
                       ({"text": ["the river", 7]}, "a list holding a int")):
        with pytest.raises(ValueError, match=re.escape(got)):  # never linked as its repr
            pyfunc.predict(wrong)


def test_two_replicas_adding_to_one_store_never_reuse_an_id(model_dir, tmp_path):
    config = EngineConfig(entity_store=str(tmp_path / "store"))
    a, b = Engine(resolve(str(model_dir)), config), Engine(resolve(str(model_dir)), config)
    assert a.add_entities([{"title": "Old Mill", "contexts": ["The Old Mill stands by the river."]}])[0]["entity_id"] == 512
    # b has not seen a's entity yet: it takes it from the store before adding its own
    assert b.add_entities([{"title": "New Mill", "contexts": ["The New Mill is quiet."]}])[0]["entity_id"] == 513
    with pytest.raises(RequestError, match="exists already"):
        b.add_entities([{"title": "Old Mill", "contexts": ["The Old Mill again."]}])
    fresh = Engine(resolve(str(model_dir)), config)
    assert fresh.titles[512:] == ["Old Mill", "New Mill"]
    assert torch.equal(fresh.table.weight[512:], b.table.weight[512:])
    a.sync_store()
    assert a.titles[512:] == ["Old Mill", "New Mill"]


@pytest.mark.parametrize("backend", ["faiss", "triton"])
def test_faiss_table_retrieves_as_the_model_s_own_table(backend):
    """Through either index (triton: the GPU path's, here under Triton's interpreter), also
    after rows are appended; the triton table keeps one copy of E, the index's."""
    from eae_model.entity_table import entity_attention
    from eae_platform.serving.table import FaissEntityTable

    torch.manual_seed(0)
    weight, h = torch.randn(300, 16), torch.randn(7, 16)
    table = FaissEntityTable(weight, IndexConfig(backend=backend))
    assert table.index.backend == backend
    for k in (1, 10, None):
        expected, _ = entity_attention(h, weight, k)
        assert torch.allclose(table.attend(h, k).retrieved, expected, atol=1e-5)
    assert table.add_rows(3 * h[:2]) == [300, 301]
    grown = torch.cat([weight, 3 * h[:2]])
    assert torch.equal(table.weight, grown) and len(table.index) == 302
    if backend == "triton":
        assert table.weight is table.index.index.rows
    scores, ids = table.top_k(h, 10)
    want = (h @ grown.T).topk(10)
    assert torch.equal(ids, want.indices) and torch.allclose(scores, want.values, atol=1e-5)
    for k in (1, 10):
        expected, _ = entity_attention(h, grown, k)
        assert torch.allclose(table.attend(h, k).retrieved, expected, atol=1e-5)


def test_cli_entities_add_url_without_a_server_or_a_scheme_is_one_clear_error(capsys):
    """urllib's own words were a traceback file and exit 1: "URLError: ... Connection refused",
    "unknown url type: 127.0.0.1"."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        add = ["entities", "add", "--title", "Ada Quill", "--context", "Ada Quill wrote."]
        assert main([*add, "--url", f"http://127.0.0.1:{port}"]) == 2
        err = capsys.readouterr().err
        assert f"--url http://127.0.0.1:{port}: no server answered" in err and "traceback" not in err
        assert main([*add, "--url", f"127.0.0.1:{port}"]) == 2
        assert f"e.g. http://127.0.0.1:{port}" in capsys.readouterr().err


def test_cli_entities_add_file_that_is_not_there_names_the_flag(tmp_path, capsys):
    """It said "[Errno 2] No such file or directory: '...'", naming neither --file nor what it holds."""
    assert main(["entities", "add", "--file", str(tmp_path / "new.jsonl"), "--url", "http://127.0.0.1:1"]) == 2
    assert f"--file {tmp_path / 'new.jsonl'}: no such file (JSON lines of" in capsys.readouterr().err


def test_entities_of_another_data_are_refused_not_served_under_wrong_titles(model_dir, tmp_path, monkeypatch, capsys):
    """docs/serving.md's `eae serve --model CHECKPOINT --entities runs/wiki-sample`, with the quick
    start's model of a synthetic world, served the gensim sample's titles for its ids."""
    import socket

    import pyarrow as pa
    import pyarrow.parquet as pq

    import eae_platform.ray_session

    other = tmp_path / "other-data"
    other.mkdir()
    pq.write_table(pa.table({"entity_id": pa.array(range(600), pa.int32()), "title": [f"Other {i}" for i in range(600)],
                             "count": pa.array([1] * 600, pa.int64())}), other / "entities.parquet")
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    shutil.copy(model_dir / "model.safetensors", ckpt)
    config = json.loads((model_dir / "config.json").read_text())
    (ckpt / "state.json").write_text(json.dumps({"config": {"model": config, "train": {"data": str(model_dir)}}}))
    for model in (model_dir, ckpt):  # its own entities.parquet; its checkpoint's train.data's
        with pytest.raises(ValueError, match="entity 0 is 'Other 0' there but 'Entity number 0'"):
            resolve(str(model), str(other))
        assert resolve(str(model), str(model_dir)).titles_file == model_dir / "entities.parquet"  # its own: fine

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(eae_platform.ray_session, "connect", no_ray)
    with socket.socket() as s:  # a free port: 8000 may be another server's, refused for that
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", "--model", str(ckpt), "--entities", str(other), "--port", str(port)]) == 2
    assert "not the data it was trained on" in capsys.readouterr().err


def test_serve_of_a_directory_that_holds_no_model_is_refused_before_ray_starts(tmp_path, monkeypatch, capsys):
    """`--set model=DIR` naming a data directory started Ray and exited 1 when the replica failed."""
    import socket

    import eae_platform.ray_session

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(eae_platform.ray_session, "connect", no_ray)
    (tmp_path / "world.xml").write_text("<mediawiki/>")
    with socket.socket() as s:  # a free port: 8000 may be another server's, refused for that
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", "--model", str(tmp_path), "--port", str(port)]) == 2
    assert "neither a model directory (model.safetensors + config.json)" in capsys.readouterr().err
