"""The Ray Serve application: a FastAPI ingress (`EaEApi`) in front of a model deployment
(`EaEModelServer`, one Engine per replica) whose requests are batched dynamically
(@serve.batch: up to max_batch_size requests, or what arrived within batch_wait_timeout_s,
share one forward pass).

    serve deploy serve_apps/eae.yaml        # any cluster where eae-platform is installed
    eae serve --model models:/eae@pretrained [--port 8000]     # a local cluster

Endpoints: POST /v1/link (?format=displacy), POST /rel (REL's API), POST /v1/answer,
POST /v1/entities, GET /entity/{id} (JSON; an HTML page for browsers), GET /healthz, GET /readyz,
GET / (the web page), GET /docs (OpenAPI).
Bad input is a 4xx JSON {"error": message}; the replica serves on. The exception: what Serve's
HTTP proxy (uvicorn with httptools) refuses before any application sees it, a malformed request
line or a URL over 65,535 bytes, is uvicorn's plain-text 400 "Invalid HTTP request received.";
Serve offers no hook there (tests/eae_platform/test_serve.py pins it).
"""


import asyncio
import dataclasses
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from ray import serve

from eae_platform.serving.engine import EngineConfig, RequestError
from eae_platform.serving.index import IndexConfig
from eae_platform.serving.page import PAGE, entity_page

LOAD_WAIT_S = 300.0  # how long a request waits for its replica's model before a 503


@dataclass
class ServeSettings:
    """Everything the application needs; the `args:` of a Serve config (nested `engine:` and
    `engine.index:` sections) or `eae serve`'s options."""

    model: str  # models:/name@alias, an `eae pretrain --out` directory or a checkpoint
    entities: str | None = None  # entities.parquet (or its data directory) for the titles
    mlflow_uri: str | None = None  # for models:/ URIs; default MLFLOW_TRACKING_URI, else ./mlflow.db
    num_replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float | None = None  # None: replica_gpus' share of the cluster's GPUs, 0 without any
    batching: bool = True
    max_batch_size: int = 16
    batch_wait_timeout_s: float = 0.005
    max_ongoing_requests: int = 64  # per model replica: >= max_batch_size, or batches never fill
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if isinstance(self.engine, dict):
            engine = _section(self.engine, EngineConfig, "engine")
            if isinstance(engine.get("index"), dict):
                engine["index"] = IndexConfig(**_section(engine["index"], IndexConfig, "engine.index"))
            elif "index" in engine and not isinstance(engine["index"], IndexConfig):
                raise ValueError(f"engine.index must be a mapping of settings, got {engine['index']!r}")
            self.engine = EngineConfig(**engine)
        elif not isinstance(self.engine, EngineConfig):
            raise ValueError(f"engine must be a mapping of settings (engine.KEY=VALUE), got {self.engine!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model is required: models:/name@alias, a model directory or a checkpoint")
        if self.num_replicas < 1 or self.max_batch_size < 1 or self.batch_wait_timeout_s < 0:
            raise ValueError("num_replicas and max_batch_size must be >= 1, batch_wait_timeout_s >= 0")
        if self.gpus_per_replica is not None and self.gpus_per_replica < 0:
            raise ValueError(f"gpus_per_replica must be >= 0 (or null: the cluster's GPUs shared), got {self.gpus_per_replica}")

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> "ServeSettings":
        return cls(**_section(args, cls, "serve"))


def _section(values: dict[str, Any], cls, name: str) -> dict[str, Any]:
    """A section's settings (the top level's or a nested one's), its keys checked: an unknown
    one was a TypeError from the dataclass and a traceback file."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {name} settings: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return dict(values)


def replica_gpus(given: float | None, cluster_gpus: float, replicas: int) -> float:
    """GPUs per model replica: `given` when set; else, as the other `eae` commands take a GPU
    where the cluster has one, an equal share of the cluster's GPUs, at most one a replica
    (a replica runs one model: a second GPU would sit idle), and 0 without any."""
    if given is not None:
        return float(given)
    return min(1.0, cluster_gpus / replicas) if cluster_gpus > 0 else 0.0


# --- request bodies (strict: a number where a string belongs is refused, not converted) -------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LinkBody(_Body):
    text: StrictStr = Field(description="the text to link")
    spans: list[list[StrictInt]] | None = Field(
        None, description="[[start, length], ...] in characters: only these spans are disambiguated")
    top_k: StrictInt | None = Field(None, description="candidates per mention (default 5)")


class RelBody(_Body):
    text: StrictStr
    spans: list[list[StrictInt]] = Field(default_factory=list, description="REL: empty = end-to-end")


class AnswerBody(_Body):
    question: StrictStr
    top_k: StrictInt | None = None


class NewEntity(_Body):
    title: StrictStr
    aliases: list[StrictStr] = Field(default_factory=list, description="other names to find in string contexts")
    contexts: list[StrictStr | dict[str, Any]] = Field(
        description='example texts naming the entity: strings, or {"text": ..., "spans": [[start, length]]}')


class EntitiesBody(_Body):
    entities: list[NewEntity]
    save: StrictBool | None = Field(None, description="write to the entity store (default: when configured; "
                                    "false is refused where one is: the store numbers added entities)")


# --- the model deployment ---------------------------------------------------------------------

# A replica that is stopped (`eae serve` stopped, the app deleted, a scale-down) waits for its
# requests in flight, checking every graceful_shutdown_wait_loop_s; Serve's default, 2 s, is
# also how long it waits before its first check, so an idle replica took 2 s to stop, and Serve
# stops the ingress, then the model deployment: Ctrl-C of `eae serve` took ~8 s on 2 cores.
# Requests in flight are still waited for, up to graceful_shutdown_timeout_s (Serve's 20 s).
SHUTDOWN_WAIT_LOOP_S = 0.1


@serve.deployment(name="EaEModelServer", graceful_shutdown_wait_loop_s=SHUTDOWN_WAIT_LOOP_S)
class EaEModelServer:
    """One Engine per replica, loaded in a background thread so that the replica (and /healthz)
    is up at once and /readyz tells when the model is there."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = ServeSettings.from_args(settings)
        self.engine = None
        self.load_error: str | None = None
        self.started = time.time()
        self.loaded = threading.Event()  # set when loading ended, well or not
        self._batched.set_max_batch_size(self.settings.max_batch_size)
        self._batched.set_batch_wait_timeout_s(self.settings.batch_wait_timeout_s)
        threading.Thread(target=self._load, daemon=True).start()

    def _load(self) -> None:
        from eae_platform.serving.engine import Engine
        from eae_platform.serving.model_source import resolve

        try:
            s = self.settings
            if s.engine.num_threads is None:
                # torch's default is every core of the node: replicas would oversubscribe them
                s.engine.num_threads = max(1, round(s.cpus_per_replica))
            # A replica given no GPU may still see the node's GPUs: the device follows the request
            device = "cuda" if (s.gpus_per_replica or 0) > 0 else "cpu"
            self.engine = Engine(resolve(s.model, s.entities, s.mlflow_uri), s.engine, device)
        except Exception as exc:  # reported by /readyz, and by every request
            self.load_error = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        finally:
            self.loaded.set()

    def status(self) -> dict:
        if self.engine is not None:
            return {"ready": True, "model": self.engine.describe(), "batching": self.settings.batching,
                    "max_batch_size": self.settings.max_batch_size}
        return {"ready": False, "loading": self.load_error is None, "error": self.load_error or "the model is loading",
                "loading_for_s": round(time.time() - self.started, 1)}

    async def _need_engine(self):
        # Serve routes to a replica once its constructor returns, before the model is loaded:
        # requests that arrive meanwhile wait for it (a replacement replica takes seconds).
        if not self.loaded.is_set():
            await asyncio.to_thread(self.loaded.wait, LOAD_WAIT_S)
        if self.engine is None:
            raise RequestError(self.load_error or "the model is still loading; see /readyz", 503)
        return self.engine

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def _batched(self, prepared: list) -> list[dict]:
        return self.engine.run(prepared)

    async def handle(self, kind: str, body: dict) -> dict:
        """{"result": ...} or {"error": message, "status": code}: errors travel as values, so
        one bad request never fails the batch it would have joined."""
        try:
            engine = await self._need_engine()
            if kind == "link":
                job = engine.link_job(body["text"], body.get("spans"), body.get("top_k"))
            elif kind == "answer":
                job = engine.answer_job(body["question"], body.get("top_k"))
            elif kind == "entity":
                return {"result": engine.entity(body["entity_id"])}
            elif kind == "entities":
                return {"result": {"added": engine.add_entities(body["entities"], body.get("save")),
                                   "entities": engine.table.num_entities}}
            else:
                raise RequestError(f"unknown request kind {kind!r}")
            prepared = engine.prepare(job)
            if self.settings.batching:
                return {"result": await self._batched(prepared)}
            return {"result": engine.run([prepared])[0]}
        except RequestError as exc:
            return {"error": str(exc), "status": exc.status}


# --- the ingress ------------------------------------------------------------------------------

api = FastAPI(
    title="Entities as Experts",
    description="Entity linking, question answering and new entities without retraining (EaE, Févry et al. 2020).",
    version="1",
)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing's own errors (404 unknown path, 405 wrong method, ...) in the API's one error
    shape, {"error": ...}, instead of FastAPI's {"detail": ...}."""
    message = {404: f"no such endpoint: {request.url.path} (see /docs)",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
    response = _error(exc.status_code, message)
    for key, value in (exc.headers or {}).items():  # e.g. 405's Allow
        response.headers[key] = value
    return response


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """Pydantic's errors as one readable line: where and what, e.g. `body.text: Input should be
    a valid string`; an undecodable body (invalid JSON or UTF-8) is a 400."""
    problems = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e.get("loc", ()))
        if e.get("type") == "json_invalid":
            return _error(400, f"the body is not valid JSON ({e.get('ctx', {}).get('error', e.get('msg'))})")
        problems.append(f"{where}: {e.get('msg')}")
    return _error(422, "invalid request: " + "; ".join(problems))


@api.middleware("http")
async def _json_body(request: Request, call_next):
    """POST bodies are JSON in UTF-8 whatever Content-Type says (curl -d sends
    x-www-form-urlencoded); bytes that are not UTF-8 get a 400 that says where."""
    if request.method == "POST":
        body = await request.body()
        if not body.strip():
            return _error(400, "the body is empty: expected a JSON object")
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _error(400, f"the body is not valid UTF-8: byte {body[exc.start:exc.start + 1]!r} at offset {exc.start}")
        headers = [(k, v) for k, v in request.scope["headers"] if k.lower() != b"content-type"]
        request.scope["headers"] = [*headers, (b"content-type", b"application/json")]
    return await call_next(request)


def _rel_rows(result: dict) -> list[list]:
    """REL's answer: [start, length, mention, title, ed_conf, md_conf, tag] per mention, titles
    with underscores as REL writes them. EaE has no entity types: the tag is always MISC."""
    rows = []
    for m in result["mentions"]:
        title = m["title"].replace(" ", "_") if m["title"] else None
        rows.append([m["start"], m["end"] - m["start"], m["text"], title, m["score"], m["md_conf"], "MISC"])
    return rows


def _wikipedia_url(title: str) -> str:
    return f"https://en.wikipedia.org/wiki/{title.replace(' ', '_')}"


def _displacy(result: dict, wikipedia_below: int, entity_url) -> dict:
    """spaCy/displaCy's manual format; the label shown is the title, kb_id the entity id. kb_url
    is Wikipedia's page for ids below `wikipedia_below` (titles from Wikipedia), else this
    server's entity page, `entity_url(id)` (a synthetic world's entities, added ones)."""
    ents = []
    for m in result["mentions"]:
        title, e = m["title"], m["entity_id"]
        url = None if e is None else _wikipedia_url(title) if title and e < wikipedia_below else entity_url(e)
        ents.append({"start": m["start"], "end": m["end"], "label": title or f"entity {e}",
                     "kb_id": str(e), "score": m["score"], "kb_url": url})
    return {"text": result["text"], "ents": ents, "title": None}


# The ingress only parses and forwards (no CPU reserved, so model replicas get the cores).
@serve.deployment(name="EaEApi", max_ongoing_requests=256, ray_actor_options={"num_cpus": 0},
                  graceful_shutdown_wait_loop_s=SHUTDOWN_WAIT_LOOP_S)
@serve.ingress(api)
class EaEApi:
    def __init__(self, model):
        self.model = model  # DeploymentHandle of EaEModelServer
        self._wikipedia_below: int | None = None  # entity ids whose titles are Wikipedia's: [0, this)

    async def wikipedia_below(self) -> int:
        """The model's vocabulary size when its titles come from Wikipedia, else 0 (asked once)."""
        if self._wikipedia_below is None:
            status = await self.model.status.remote()
            if not status["ready"]:
                return 0
            about = status["model"]
            base = about["entities"] - about["added_entities"]
            self._wikipedia_below = base if about["titles_from"] == "wikipedia" else 0
        return self._wikipedia_below

    async def _call(self, kind: str, body: dict):
        # Linking and answering change nothing: a request whose replica died mid-way is sent
        # once more (the router picks a live replica); adding entities is not retried.
        from ray.exceptions import RayActorError

        attempts = 1 if kind == "entities" else 2
        for attempt in range(attempts):
            try:
                out = await self.model.handle.remote(kind, body)
                break
            except RayActorError as exc:  # the replica died mid-request, or none is running
                if attempt == attempts - 1:
                    return _error(503, f"model replica unavailable, retry: {type(exc).__name__}")
            except Exception as exc:  # a bug, not bad input: say what, without a traceback
                return _error(500, f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        if "error" in out:
            return _error(out["status"], out["error"])
        return out["result"]

    @api.get("/healthz", summary="the HTTP server is up")
    async def healthz(self) -> dict:
        return {"status": "ok"}

    @api.get("/readyz", summary="200 once a model replica has its model loaded, else 503")
    async def readyz(self):
        try:
            status = await asyncio.wait_for(self.model.status.remote(), timeout=10)
        except Exception as exc:
            return JSONResponse({"ready": False, "error": f"no model replica answers ({type(exc).__name__})"}, 503)
        return status if status["ready"] else JSONResponse(status, 503)

    @api.post("/v1/link", summary="link the entities of a text (all mentions, or the given spans)")
    async def link(self, request: Request, body: LinkBody, format: Literal["json", "displacy"] = Query("json")):
        out = await self._call("link", body.model_dump())
        if format == "displacy" and isinstance(out, dict):
            return _displacy(out, await self.wikipedia_below(), lambda e: str(request.url_for("entity", entity_id=e)))
        return out

    @api.post("/rel", summary="REL's API: {text, spans: [[start, length]]} -> [[start, length, mention, title, ed_conf, md_conf, tag]]")
    async def rel(self, body: RelBody):
        out = await self._call("link", {"text": body.text, "spans": body.spans or None, "top_k": 1})
        return _rel_rows(out) if isinstance(out, dict) else out

    @api.post("/v1/answer", summary="answer a question with ranked entities")
    async def answer(self, body: AnswerBody):
        return await self._call("answer", body.model_dump())

    @api.post("/v1/entities", summary="add entities from example contexts, without retraining")
    async def add_entities(self, body: EntitiesBody):
        return await self._call("entities", body.model_dump())

    @api.get("/entity/{entity_id}", name="entity",
             summary="one entity: title, where the title comes from, aliases (an HTML page when the client accepts text/html)")
    async def entity(self, request: Request, entity_id: int):
        out = await self._call("entity", {"entity_id": entity_id})
        if isinstance(out, dict) and out["source"] == "wikipedia" and out["title"]:
            out["wikipedia_url"] = _wikipedia_url(out["title"])
        if isinstance(out, dict) and "text/html" in request.headers.get("accept", ""):
            return HTMLResponse(entity_page(out))
        return out

    @api.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page(self) -> str:
        return PAGE


def build_app(args: dict[str, Any]):
    """Application builder (`import_path: eae_platform.serving.app:build_app` with `args:`)."""
    import ray

    s = ServeSettings.from_args(args)
    if s.gpus_per_replica is None:  # the builder runs where Ray is (eae serve's driver, Serve's controller)
        cluster_gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
        s.gpus_per_replica = replica_gpus(None, cluster_gpus, s.num_replicas)
        if s.gpus_per_replica:
            print(f"[eae serve] the cluster has {cluster_gpus:g} GPU(s): {s.gpus_per_replica:g} per replica "
                  "(gpus_per_replica=0 serves on CPUs)")
    if s.num_replicas > 1 and not s.engine.entity_store:
        print("[eae serve] note: with several replicas, entities added without an entity store reach one replica only")
    model = EaEModelServer.options(
        num_replicas=s.num_replicas,
        max_ongoing_requests=max(s.max_ongoing_requests, s.max_batch_size),
        ray_actor_options={"num_cpus": s.cpus_per_replica, "num_gpus": s.gpus_per_replica},
    ).bind(dataclasses.asdict(s))
    return EaEApi.bind(model)
