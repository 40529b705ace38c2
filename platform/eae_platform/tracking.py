"""MLflow tracking for pretraining runs, built to survive the tracking server going away.

A `Tracker` records a run: the whole config as flattened params plus a `config.json` artifact,
metrics with their steps (losses per head, dev entity and token accuracy and perplexity,
tokens/s and step time; named `<split>/<metric>`), checkpoints as artifacts, and the final
model as a registered MLflow model version, with an alias when asked (`models:/<name>@<alias>`).
Used as a context manager (`with tracker:`), it ends the run FINISHED, FAILED on an exception
and KILLED on KeyboardInterrupt or SystemExit (Ctrl-C; a Ray driver turns SIGTERM, e.g. from
`ray job stop`, into sys.exit, and Ray Train its Ctrl-C abort).

Where: `tracking_uri()`: MLFLOW_TRACKING_URI when set, else an embedded SQLite store
`mlflow.db` in the working directory.

MLflow does the logging: params, tags and metrics go in one `MlflowClient.log_batch` (which cuts
them into requests within its limits), the model through MLflow's log_model with
registered_model_name, the alias by `set_registered_model_alias`. This module adds what MLflow
lacks: when the store is unreachable, nothing raises out of the logging calls and nothing is
dropped:
  * every MLflow call fails fast (MLflow's own HTTP retries are cut down, see `FAST_FAIL_ENV`);
  * what could not be sent is queued in memory (metrics keep their step and original timestamp,
    so resending is idempotent) and journaled to `<spool_dir>/mlflow-unsent-<run_id>.jsonl`
    (crash-safe); artifacts and models to register are first staged (hard links where possible)
    under `<spool_dir>/mlflow-unsent-<run_id>/` so that checkpoint rotation cannot remove them;
  * one line is printed when the store becomes unreachable and one when it is back; while it is
    down, the store is tried again at most every `retry_interval_s` seconds (training does not
    pay a timeout per call), and the queue is sent in order when it answers;
  * `close()` tries once more (for up to `close_wait_s`), then writes whatever is still unsent to
    the JSONL file (exactly the unsent items), prints and returns a `CloseReport`;
    `replay_unsent(path)` sends such a file later.
Programming errors (a non-numeric metric, a step that is no int, a param changed after it was
logged, a reserved alias) raise at once, before anything is queued. Items the server rejects
(answers with a client error) are reported in `CloseReport.rejected`, never retried forever.
A *new* run cannot be created without the store (`TrackingUnavailable`, before training starts,
after `open_wait_s` of trying: a sweep's trials wait out a server restart);
a resumed run (`run_id=`) starts offline if need be. The queue lives in memory (~150 bytes a
metric) and in the journal on disk.

The registered model is an MLflow pyfunc whose artifacts hold the model directory, logged as
a model from code (`serving/pyfunc.py`, `EaEPyfuncModel`: its predict is the serving engine's
/v1/link), so that loading it unpickles nothing. `download_model_dir(uri)` fetches just that
directory, `load_pyfunc(uri)` the pyfunc, both from the store `tracking_uri()` names without
touching MLflow's global tracking URI.

A PostgreSQL store (a server's --backend-store-uri or a direct URI) needs the driver named:
`postgresql+psycopg2://...`; SQLAlchemy 2.1 maps a plain `postgresql://` to psycopg 3.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import numbers
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from mlflow.tracking import MlflowClient
from mlflow.utils.file_utils import local_file_uri_to_path

from eae_platform import progress

# Applied by fail_fast() (a Tracker's creation, `eae compare`'s lookups; the user's values win).
# MLflow's defaults (7 retries, backoff factor 2, 120 s timeout) make one call to a dead server
# block for minutes; with these a refused connection fails in ~2 s and a hung server in ~17 s.
FAST_FAIL_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
}


def fail_fast() -> None:
    """FAST_FAIL_ENV into this process's environment, where the user set none of them."""
    for key, value in FAST_FAIL_ENV.items():
        os.environ.setdefault(key, value)


MODEL_DIR_ARTIFACT = "model_dir"  # key of the EaE model directory among the pyfunc's artifacts
# The pyfunc's code, logged as MLflow's "model from code" (the file, not a pickled object).
PYFUNC_CODE = Path(__file__).parent / "serving" / "pyfunc.py"
DEFAULT_ALIAS = "champion"  # MLflow reserves "latest" (and "v<N>") as alias names
PARAM_TRUNCATED = "...[truncated; full value in config.json]"

# MLflow error codes that mean "try again later"; any other MlflowException is the server
# refusing the request (bad value, conflict, missing run): retrying cannot help.
_TRANSIENT_CODES = {
    "INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "IO_ERROR", "SERVICE_UNDER_MAINTENANCE",
    "WORKSPACE_TEMPORARILY_UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED",
    "ABORTED", "REQUEST_LIMIT_EXCEEDED", "UNPARSEABLE_HTTP_ERROR", "COULD_NOT_ACQUIRE_LOCK",
}  # fmt: skip

_PREFIX = "[eae tracking]"
# A new run's token, so that a retried create_run is found rather than repeated (_create_run)
CREATE_REQUEST_TAG = "eae.create_request"


def _artifact_root(uri: str) -> str | None:
    """Artifacts of a SQLite store go next to its database file. MLflow's default, `./mlruns`,
    is taken relative to the process that creates the experiment: for a Ray Train worker that
    is a temporary session directory, deleted with the cluster. Servers choose their own."""
    store = sqlite_path(uri)
    return (store.resolve().parent / "mlartifacts").as_uri() if store else None


def artifact_location(artifact_uri: str, path: str = "") -> str:
    """Where a run's artifacts under `path` are: a local directory for a `file:` URI (a SQLite
    store's mlartifacts next to its database), else the URI itself (mlflow-artifacts:/..., s3://...)."""
    uri = artifact_uri.rstrip("/") + (f"/{path}" if path else "")
    return local_file_uri_to_path(uri) if uri.startswith("file:") else uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (MLflow creates it, empty, where it is missing:
    a reader checks it is there first), else None."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def tracking_uri(uri: str | None = None) -> str:
    """`uri` when given, else MLFLOW_TRACKING_URI when set, else the embedded SQLite store
    `mlflow.db` in the working directory. A SQLite store's path is made absolute: Ray Train's
    workers and Ray tasks run in directories of their own, where a relative `sqlite:///mlflow.db`
    named another, empty store (the worker then found no run of the driver's id)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "").strip() or "sqlite:///mlflow.db"
    store = sqlite_path(uri)
    return f"sqlite:///{store.absolute()}" if store else uri


def unreachable(uri: str, exc: BaseException) -> str | None:
    """"tracking store URI unreachable (...)" when `exc` is the store or the way to it failing
    (not a request it refused), else None: a reader's one-line error, as a new run's."""
    return f"tracking store {uri} unreachable ({_short(exc)})" if _is_transient(exc) else None


# MLflow's database stores other than SQLite, by their URI's scheme (before any `+driver`)
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
# Each driver's own name for its connection timeout, in seconds: without it a store behind a
# firewall that drops packets is waited for as long as the OS's TCP timeout (minutes)
CONNECT_TIMEOUT_ARGS = {"psycopg2": "connect_timeout", "psycopg": "connect_timeout", "pymysql": "connect_timeout",
                        "mysqldb": "connect_timeout", "pymssql": "login_timeout"}
CONNECT_TIMEOUT_S = 5


def check_reachable(uri: str) -> None:
    """Before a command starts Ray to open a new run: a LookupError (`eae` exits 2) with one
    line when `uri` is a tracking store that does not answer, as `eae compare` says it. A new
    run's Tracker said it only after the local Ray cluster had started (~10-20 s), behind two
    urllib3 retry warnings that Ray's logging set-up prints. A tracking server (http(s)) is asked
    one request, under fail_fast's retries (a refused port in ~3 s); a database store
    (`postgresql://`, `mysql+pymysql://`, ...) one connection (_check_database). A SQLite store
    is not asked: it is a local file, and asking it would only add its start-up to every command."""
    if uri.startswith(("http://", "https://")):
        fail_fast()
        try:
            mlflow_client(uri).search_experiments(max_results=1)
        except Exception as error:  # noqa: BLE001 - a refusal other than the store being away is the run's to report
            reason = unreachable(uri, error)
            if reason:
                raise LookupError(f"cannot create an MLflow run: {reason}") from None
    elif uri.partition(":")[0].partition("+")[0] in DATABASE_SCHEMES:
        _check_database(uri)


def _check_database(uri: str) -> None:
    """One connection to a database store, opened and closed (no MLflow store: that would
    create or migrate its tables), the password hidden wherever the URI is said. A driver not
    installed is said with the store it is for (SQLAlchemy names only the module)."""
    import sqlalchemy

    try:
        url = sqlalchemy.make_url(uri)
        shown = url.render_as_string(hide_password=True)
        timeout = CONNECT_TIMEOUT_ARGS.get(url.get_driver_name())
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.NullPool,
                                          connect_args={timeout: CONNECT_TIMEOUT_S} if timeout else {})
    except ModuleNotFoundError as error:
        raise LookupError(f"cannot create an MLflow run: tracking store {shown} needs the Python module {error.name}, "
                          f"not installed here: install it, or name an installed driver ({url.get_backend_name()}"
                          "+DRIVER://...)") from None
    except Exception:  # noqa: BLE001 - a URI SQLAlchemy cannot take is MLflow's to report, as it does
        return
    try:
        with engine.connect():
            pass
    except Exception as error:  # noqa: BLE001 - as for a server: only the store being away is said here
        reason = unreachable(shown, error)
        if reason:
            raise LookupError(f"cannot create an MLflow run: {reason}") from None
    finally:
        engine.dispose()


def mlflow_client(uri: str) -> MlflowClient:
    """An MlflowClient of `uri`'s tracking store and registry. A URI of no store MLflow knows
    (`foo://host`, a typo) is a ValueError naming it: MLflow's own exception does not unpickle,
    and from a Ray task it came back as "UnserializableException: Failed to deserialize exception"."""
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    try:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    except UnsupportedModelRegistryStoreURIException as error:
        schemes = ", ".join(f"{s}:" for s in error.supported_uri_schemes if s)
        raise ValueError(f"tracking URI {uri!r}: MLflow has no store of that kind (known: {schemes} or a path)") from None


@contextlib.contextmanager
def _global_uris(uri: str):
    """MLflow's log_model and its registration reach the store through the global tracking and
    registry URIs alone: both point at `uri` for the call. mlflow.set_tracking_uri also writes
    MLFLOW_TRACKING_URI, which `tracking_uri()` reads: afterwards the globals are unset again
    (resolved from the environment, as when nothing set them) and the environment put back.
    Process-wide: another thread's fluent MLflow call meanwhile would go to `uri` too."""
    saved = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _say(message: str, relay: bool = True) -> None:
    """A tracking warning on stderr; from a Ray worker whose output the driver does not stream
    (rank 0 of `eae pretrain`, the task of `eae finetune qa` or `eae eval`), through the driver's
    relay as well (`relay`): there it said an outage mid-run only in the summary at the end."""
    line = f"{_PREFIX} {message}"
    if relay and progress.relayed():
        try:
            progress.say(line, err=True)
        except Exception:  # noqa: BLE001 - the relay is gone (the driver stopped): the log keeps it
            pass
    print(line, file=sys.stderr, flush=True)


def _is_transient(exc: BaseException) -> bool:
    """True for failures of the store or the way to it (connection refused, timeout, 5xx,
    database locked), False for a request the store refused."""
    if isinstance(exc, MlflowException):
        return exc.error_code in _TRANSIENT_CODES
    try:
        import requests

        if isinstance(exc, requests.RequestException):
            return True
    except ImportError:  # pragma: no cover
        pass
    try:
        import sqlalchemy.exc

        if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
            return True
    except ImportError:  # pragma: no cover
        pass
    return isinstance(exc, (ConnectionError, TimeoutError, OSError))


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Config flattening and validation


def _plain(node: Any) -> Any:
    """Dataclasses and mappings -> dicts, tuples and sets -> lists, paths -> str, recursively."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        node = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    if isinstance(node, Mapping):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple, set, frozenset)):
        return [_plain(v) for v in node]
    if isinstance(node, Path):
        return str(node)
    return node


def _config_to_dict(config: Any) -> dict:
    if not (isinstance(config, Mapping) or (dataclasses.is_dataclass(config) and not isinstance(config, type))):
        raise TypeError(f"config must be a mapping or a dataclass, not {type(config).__name__}")
    return _plain(config)


def _param_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Path):
        return str(value)
    return json.dumps(value, default=str)


def flatten_config(config: Any, sep: str = ".") -> dict[str, str]:
    """Nested mappings (and dataclasses) -> {"model.hidden_size": "64", ...}; strings stay as
    they are, everything else is JSON (`true`, `null`, `[1, 2]`)."""
    out: dict[str, str] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping) and (node or not prefix):
            for key, value in node.items():
                walk(f"{prefix}{sep}{key}" if prefix else str(key), value)
        else:
            out[prefix] = _param_value(node)

    walk("", _config_to_dict(config))
    return out


def _metric_value(key: str, value: Any) -> float:
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item) and not isinstance(value, (str, bytes)):
        try:
            result = item()
        except (ValueError, RuntimeError) as exc:  # more than one element
            raise TypeError(f"metric {key!r}: {type(value).__name__} is not a scalar ({exc})") from None
        if isinstance(result, numbers.Real):
            return float(result)
    raise TypeError(f"metric {key!r} must be a real number, got {type(value).__name__}: {value!r}")


def validate_alias(alias: str) -> None:
    """MLflow's rule for alias names (word characters and dashes, at most 255; "latest" and
    "v<N>" are reserved), checked before the registration is queued: a bad alias is the caller's
    error now, not a refusal found after an outage, at replay (MLflow checks it when the alias is
    set, and has no public check). `eae pretrain` checks its alias before it trains."""
    if not re.fullmatch(r"[\w-]{1,255}", alias) or alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias):
        raise ValueError(f"invalid model alias {alias!r}: word characters and dashes, not 'latest' or 'v<N>'")


def validate_model_name(name: str) -> None:
    """MLflow's rule for registered model names (mlflow.utils.validation._validate_model_name:
    not blank, no '/' or ':', not '.' nor starting '..'), checked before anything trains: MLflow
    refuses such a name only when the trained model is registered, after the run."""
    if not isinstance(name, str) or not name.strip() or any(c in name for c in "/:") or name == "." \
            or name.startswith(".."):
        raise ValueError(f"invalid registered model name {name!r}: not blank, no '/' or ':', not '.' or '..'")


def _stage(source: Path, target: Path) -> None:
    """Copy a file or tree to `target` with hard links where possible (cheap, and immune to the
    source being deleted), else plain copies."""

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, copy_function=link_or_copy)
    else:
        link_or_copy(str(source), str(target))


# ---------------------------------------------------------------------------------------------
# The registered model


def _pip_requirements() -> list[str]:
    """The pyfunc's packages at their installed versions: the model's, and the serving
    engine's (faiss, pyarrow for the titles) that its predict runs."""
    from importlib.metadata import PackageNotFoundError, version

    reqs = []
    for dist in ("mlflow", "torch", "safetensors", "tokenizers", "pyyaml", "numpy", "pyarrow", "faiss-cpu|faiss-gpu"):
        for name in dist.split("|"):  # whichever of the alternatives is installed, else the first
            try:
                reqs.append(f"{name}=={version(name)}")
                break
            except PackageNotFoundError:
                pass
        else:
            reqs.append(dist.split("|")[0])
    return reqs


def _model_dir_path_in(mlmodel_dir: Path) -> str:
    flavor = Model.load(str(mlmodel_dir / "MLmodel")).flavors.get("python_function", {})
    try:
        return flavor["artifacts"][MODEL_DIR_ARTIFACT]["path"]
    except (KeyError, TypeError):
        raise ValueError(f"not an EaE model: its MLmodel has no {MODEL_DIR_ARTIFACT!r} artifact") from None


class _ModelSource:
    """The artifacts of a registered model version, `models:/<name>@<alias>` or
    `models:/<name>/<version>`, resolved through a client of `uri` alone (MLflow's own
    ModelsArtifactRepository resolves aliases through the global registry URI)."""

    def __init__(self, model_uri: str, uri: str):
        ref = model_uri.removeprefix("models:/")
        if not model_uri.startswith("models:/") or not ("@" in ref or "/" in ref):  # models:/eae: no alias, no version
            raise ValueError(f"{model_uri!r} is not a models:/<name>@<alias> or models:/<name>/<version> URI")
        client = mlflow_client(uri)
        try:
            if "@" in ref:
                name, alias = ref.split("@", 1)
                number = client.get_model_version_by_alias(name, alias).version
            else:
                name, number = ref.rsplit("/", 1)
            # where the store keeps the version's files: its source, `models:/<model id>`, is no
            # place to download from
            self.source, self.uri = client.get_model_version_download_uri(name, number).rstrip("/"), uri
        except MlflowException as error:  # no such model, alias or version: bad input, one line (not the store down)
            if error.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise
            raise LookupError(f"{model_uri}: {error.message.rstrip('.')} in {uri}") from None

    def download_artifacts(self, path: str, dst_path: str) -> str:
        artifact = f"{self.source}/{path}" if path else self.source
        return mlflow.artifacts.download_artifacts(artifact_uri=artifact, dst_path=dst_path, tracking_uri=self.uri)


def check_registered(model_uri: str, uri: str | None = None) -> None:
    """A LookupError naming the URI and the store where the registry of `uri` (default
    `tracking_uri()`) has no such model, alias or version; nothing is downloaded."""
    _ModelSource(model_uri, uri or tracking_uri())


def load_pyfunc(model_uri: str, uri: str | None = None, dst_path: str | Path | None = None):
    """`mlflow.pyfunc.load_model` for a `models:/name@alias` URI of the store at `uri` (default
    `tracking_uri()`), without touching MLflow's global tracking URI (mlflow.set_tracking_uri
    also rewrites the MLFLOW_TRACKING_URI environment variable)."""
    uri = uri or tracking_uri()
    dst = Path(dst_path) if dst_path else Path(tempfile.mkdtemp(prefix="eae-pyfunc-"))
    dst.mkdir(parents=True, exist_ok=True)
    local = _ModelSource(model_uri, uri).download_artifacts("", dst_path=str(dst))
    return mlflow.pyfunc.load_model(local)


MODEL_CACHE_ENV = "EAE_MODEL_CACHE"  # where download_model_dir keeps one copy a model version


def model_cache_dir() -> Path:
    """$EAE_MODEL_CACHE, else the user's cache directory (`$XDG_CACHE_HOME/eae/models`, default
    `~/.cache/eae/models`, as Hugging Face's and pip's caches): per user, since entries are made
    readable by their owner only and a directory shared by a machine's users (the temporary
    directory) would refuse the second user's downloads."""
    if os.environ.get(MODEL_CACHE_ENV):
        return Path(os.environ[MODEL_CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eae" / "models"


def download_model_dir(model_uri: str, dst_path: str | Path | None = None, uri: str | None = None) -> Path:
    """Download the EaE model directory (`model.safetensors` + `config.json`) of a registered
    model, e.g. `models:/eae@champion`, and return its local path (under `dst_path`, else in this
    machine's model cache). Nothing but the model directory and the small MLmodel file move.

    The cache (`model_cache_dir()`: $EAE_MODEL_CACHE, default ~/.cache/eae/models) holds one copy a model version, read
    only by its users: each `eae finetune qa --init models:/...`, each Tune trial and each `eae
    eval` downloaded the model into a temporary directory of its own that nothing removed (a
    sweep of 15 trials of the paper preset: 15 copies of ~1.5 GB)."""
    uri = uri or tracking_uri()
    repo = _ModelSource(model_uri, uri)
    if dst_path is None:
        return _cached_model_dir(repo)
    Path(dst_path).mkdir(parents=True, exist_ok=True)
    return _download_model_dir(repo, Path(dst_path))


def _download_model_dir(repo: _ModelSource, dst: Path) -> Path:
    """The model directory of `repo`'s version, downloaded under `dst`: its MLmodel file first
    (to a scratch directory), which says where the directory is among the artifacts."""
    with tempfile.TemporaryDirectory() as tmp:
        repo.download_artifacts("MLmodel", dst_path=tmp)
        inner = _model_dir_path_in(Path(tmp))
    return Path(repo.download_artifacts(inner, dst_path=str(dst)))


def _cached_model_dir(repo: _ModelSource) -> Path:
    """The model version's directory in the cache, downloaded once: into a partial directory
    first, then renamed into place, so that trials starting together never read half a copy
    (the one whose rename loses removes its own). A version's files never change, so its
    download location (with the store's URI) names it."""
    import hashlib

    root = model_cache_dir()
    entry = root / hashlib.sha256(f"{repo.uri}\n{repo.source}".encode()).hexdigest()[:24]
    marker = entry / ".eae-model-dir"  # the model directory's path inside the entry
    if marker.is_file():
        return entry / marker.read_text()
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    try:
        local = _download_model_dir(repo, partial)
        (partial / marker.name).write_text(str(local.relative_to(partial)))
        try:
            partial.rename(entry)
        except OSError:  # another process put the same version there first
            if not marker.is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return entry / marker.read_text()


# ---------------------------------------------------------------------------------------------
# The tracker


@dataclasses.dataclass
class CloseReport:
    """What `Tracker.close()` could not log. `ok` when everything was sent."""

    run_id: str
    uri: str
    status: str
    unsent_metrics: int = 0
    unsent_params: int = 0
    unsent_tags: int = 0
    unsent_artifacts: list[str] = dataclasses.field(default_factory=list)  # artifact paths
    unsent_models: list[str] = dataclasses.field(default_factory=list)  # "name@alias" (or "name")
    status_unsent: bool = False
    rejected: list[str] = dataclasses.field(default_factory=list)  # refused by the server, why
    unsent_path: Path | None = None  # the JSONL file holding everything above

    @property
    def ok(self) -> bool:
        return not (
            self.unsent_metrics or self.unsent_params or self.unsent_tags or self.unsent_artifacts
            or self.unsent_models or self.status_unsent or self.rejected
        )  # fmt: skip

    def to_dict(self) -> dict:
        """JSON-ready: the fields, `ok` and the text."""
        data = dataclasses.asdict(self)
        data["unsent_path"] = str(self.unsent_path) if self.unsent_path else None
        return {**data, "ok": self.ok, "text": str(self)}

    def __str__(self) -> str:
        if self.ok:
            return f"run {self.run_id}: everything logged to {self.uri}"
        parts = [
            f"{n} {what}"
            for n, what in (
                (self.unsent_metrics, "metrics"), (self.unsent_params, "params"), (self.unsent_tags, "tags"),
                (len(self.unsent_artifacts), "artifact uploads"), (len(self.unsent_models), "model registrations"),
            )  # fmt: skip
            if n
        ]
        if self.status_unsent:
            parts.append(f"the final status {self.status}")
        text = f"run {self.run_id} at {self.uri}:"
        if parts:
            text += " NOT logged: " + ", ".join(parts) + ";"
        if self.rejected:
            text += f" {len(self.rejected)} items refused by the server: " + "; ".join(self.rejected[:5]) + ";"
        text = text.rstrip(";")
        if self.unsent_path:
            text += f"; written to {self.unsent_path} (send later with eae_platform.tracking.replay_unsent)"
        return text


class TrackingUnavailable(RuntimeError):
    """A new run could not be created because the tracking store is unreachable."""


class Tracker:
    """One MLflow run, logged from rank 0 of training. See the module docstring for what
    happens when the store is unreachable.

    experiment: experiment name (created if missing); run_name, tags: for a new run;
    uri: tracking URI (default `tracking_uri()`); run_id: resume that run instead of creating
    one (works offline: everything queues until the store answers); spool_dir: where the
    unsent-items journal and staged artifacts go (default: the working directory);
    retry_interval_s: while the store is unreachable, how often to try it again;
    close_wait_s: how long close() keeps trying before writing the unsent file;
    open_wait_s: how long creating a new run keeps trying an unreachable store before
    TrackingUnavailable (0: at once, a command's clear error; a sweep's trials wait out a
    server restart instead of failing)."""

    def __init__(
        self,
        experiment: str,
        run_name: str | None = None,
        uri: str | None = None,
        run_id: str | None = None,
        tags: Mapping[str, Any] | None = None,
        spool_dir: str | Path | None = None,
        retry_interval_s: float = 30.0,
        close_wait_s: float = 10.0,
        open_wait_s: float = 0.0,
    ):
        fail_fast()
        self.uri = uri or tracking_uri()
        self.experiment = experiment
        self.spool_dir = Path(spool_dir) if spool_dir else Path.cwd()
        self.retry_interval_s = float(retry_interval_s)
        self.close_wait_s = float(close_wait_s)
        self._client = mlflow_client(self.uri)
        self._http = self.uri.startswith(("http://", "https://"))
        self._local_retries = 0 if self._http else 1  # MLflow retries HTTP itself

        self._params: dict[str, str] = {}  # every param value given, sent or not
        self._q_params: dict[str, str] = {}
        self._q_tags: dict[str, str] = {}
        self._q_metrics: deque[tuple[str, float, int, int]] = deque()  # key, value, timestamp ms, step
        self._q_files: deque[dict] = deque()  # {"type": "artifacts", local_path, artifact_path, staged}
        self._q_models: deque[dict] = deque()  # {"type": "register_model", model_dir, name, alias, ...}
        self._rejected: list[dict] = []
        # every model version this Tracker registered, in order: {name, alias, version, uri}; one
        # queued while the store was away is added when it is registered (by a later call or close)
        self.registered: list[dict] = []
        self._down = False
        self._next_try = 0.0
        self._journal_path: Path | None = None
        self._closed: CloseReport | None = None

        self.experiment_id: str | None = None
        self.artifact_uri: str | None = None  # where its artifacts go (None: resumed, the store unanswering)
        if run_id is None:
            all_tags = {str(k): str(v) for k, v in (tags or {}).items()}
            all_tags[CREATE_REQUEST_TAG] = uuid.uuid4().hex
            deadline, retry = time.monotonic() + open_wait_s, False
            while True:
                try:
                    self.experiment_id = self._call(self._experiment_id, experiment)
                    run = self._create_run(all_tags, run_name, retry)
                    break
                except Exception as exc:
                    if not _is_transient(exc):
                        raise
                    if time.monotonic() >= deadline:
                        raise TrackingUnavailable(
                            f"cannot create an MLflow run: tracking store {self.uri} unreachable ({_short(exc)})"
                        ) from exc
                    time.sleep(1.0)
                    retry = True
            self.run_id, self.artifact_uri = run.info.run_id, run.info.artifact_uri
        else:
            self.run_id = run_id
            try:
                run = self._call(self._client.get_run, run_id)
                self.experiment_id, self.artifact_uri = run.info.experiment_id, run.info.artifact_uri
                self._params.update(run.data.params)
                self._call(self._client.update_run, run_id, "RUNNING")
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                self._mark_down(exc)  # resume offline: everything queues
            if tags:
                self.set_tags(tags)

    # --- public API -----------------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        """False from the moment a call failed for want of the store until one succeeds."""
        return not self._down

    @property
    def pending(self) -> dict[str, int]:
        return {
            "metrics": len(self._q_metrics), "params": len(self._q_params), "tags": len(self._q_tags),
            "artifacts": len(self._q_files), "models": len(self._q_models),
        }  # fmt: skip

    @property
    def unsent_path(self) -> Path:
        return self.spool_dir / f"mlflow-unsent-{self.run_id}.jsonl"

    def log_config(self, config: Any) -> dict[str, str]:
        """Log a (nested) config: flattened params (`model.hidden_size`) plus the whole config
        as `config.json`. Values longer than MLflow's limit are truncated in the params (the
        JSON has them whole). Raises ValueError when a param already logged in this run (also
        in an earlier attempt of a resumed run) had another value. Returns the params."""
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        self._check_open()
        data = _config_to_dict(config)
        params = flatten_config(data)
        truncated = []
        for key, value in params.items():
            if len(value) > MAX_PARAM_VAL_LENGTH:
                params[key] = value[: MAX_PARAM_VAL_LENGTH - len(PARAM_TRUNCATED)] + PARAM_TRUNCATED
                truncated.append(key)
        conflicts = {k: (self._params[k], v) for k, v in params.items() if k in self._params and self._params[k] != v}
        if conflicts:
            shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in list(conflicts.items())[:10])
            raise ValueError(f"MLflow params are immutable; run {self.run_id} already has other values for {shown}")
        if truncated:
            _say(f"params {', '.join(truncated)} cut to {MAX_PARAM_VAL_LENGTH} characters; config.json has them whole")
        new = {k: v for k, v in params.items() if k not in self._params}
        self._params.update(params)
        self._q_params.update(new)
        self._journal([{"type": "param", "key": k, "value": v} for k, v in new.items()])
        # a file in the queue, not MlflowClient.log_dict: it waits out an outage as artifacts do
        path = Path(tempfile.mkdtemp(prefix="eae-config-")) / "config.json"
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        self._enqueue_file(path, None, staged=False, cleanup=True)
        self._maybe_flush()
        return params

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._check_open()
        items = {str(k): str(v) for k, v in tags.items()}
        self._q_tags.update(items)
        self._journal([{"type": "tag", "key": k, "value": v} for k, v in items.items()])
        self._maybe_flush()

    def log_metrics(self, metrics: Mapping[str, Any], step: int, timestamp_ms: int | None = None) -> None:
        """Log {name: number} at `step`. Raises TypeError for a value or step that is no number;
        never for the store (a name the store refuses is reported at close)."""
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"step must be an int, got {type(step).__name__}: {step!r}")
        ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        items = [(k, _metric_value(k, v), ts, int(step)) for k, v in metrics.items()]
        self._q_metrics.extend(items)
        self._journal([_metric_record(m) for m in items])
        self._maybe_flush()

    def log_train_step(
        self, step: int, losses: Mapping[str, Any], step_time_s: float, tokens: int, **extra: Any
    ) -> None:
        """Training metrics of one step: `train/loss` (the total, when `losses` has "total" or
        "loss"), `train/loss_<head>` per head, `train/step_time_s`, `train/tokens_per_s`."""
        metrics: dict[str, Any] = {}
        for head, value in losses.items():
            metrics["train/loss" if head in ("total", "loss") else f"train/loss_{head}"] = value
        step_time_s = float(step_time_s)
        metrics["train/step_time_s"] = step_time_s
        metrics["train/tokens_per_s"] = tokens / step_time_s if step_time_s > 0 else math.nan
        metrics.update({f"train/{k}": v for k, v in extra.items()})
        self.log_metrics(metrics, step)

    def log_dev(
        self, step: int, entity_accuracy: float, token_accuracy: float, perplexity: float, **extra: Any
    ) -> None:
        """Dev-split metrics: `dev/entity_accuracy`, `dev/token_accuracy`, `dev/perplexity`,
        plus `dev/<name>` for each extra (e.g. per-head losses)."""
        metrics = {
            "dev/entity_accuracy": entity_accuracy, "dev/token_accuracy": token_accuracy, "dev/perplexity": perplexity
        }  # fmt: skip
        metrics.update({f"dev/{k}": v for k, v in extra.items()})
        self.log_metrics(metrics, step)

    def log_artifacts(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file or a directory tree under `artifact_path` of the run. If the store is
        unreachable, the files are staged (hard links) and uploaded later."""
        self._check_open()
        local_path = Path(local_path)
        if not local_path.exists():
            raise FileNotFoundError(f"{local_path} does not exist")
        self._enqueue_file(local_path, artifact_path, staged=False)
        self._maybe_flush()
        self._stage_pending()  # what is still queued must not depend on the caller's files

    def log_checkpoint(self, checkpoint_dir: str | Path, step: int) -> str:
        """A checkpoint directory as artifacts `checkpoints/step-<step>`; returns that path."""
        path = f"checkpoints/step-{int(step):08d}"
        self.log_artifacts(checkpoint_dir, path)
        return path

    def register_model(
        self, model_dir: str | Path, name: str, alias: str | None = DEFAULT_ALIAS, step: int = 0,
        artifact_name: str = "model",
    ) -> str | None:
        """Log the EaE model directory as an MLflow pyfunc model (`PYFUNC_CODE`, whose
        artifacts hold the directory) linked to this run, register it as a new version of `name`
        and point `alias` at it (alias None: a new version only, no alias moves). Returns
        `models:/<name>@<alias>`, or without an alias `models:/<name>/<version>` (None while the
        registration is queued). If the store is unreachable the registration is queued (the
        directory staged) and done when it answers or at close; until then the URI resolves to
        the previous version, if any."""
        from eae_model.checkpoint import CONFIG, WEIGHTS

        self._check_open()
        model_dir = Path(model_dir)
        for file in (WEIGHTS, CONFIG):
            if not (model_dir / file).is_file():
                raise FileNotFoundError(f"{model_dir / file} not found: not a saved EaE model directory")
        validate_model_name(name)
        if alias is not None:
            validate_alias(alias)
        entry = {
            "type": "register_model", "model_dir": str(model_dir), "name": name, "alias": alias,
            "step": int(step), "artifact_name": artifact_name, "staged": False,
        }  # fmt: skip
        self._q_models.append(entry)
        self._journal([entry])
        self._maybe_flush()
        self._stage_pending()
        if alias is not None:
            return f"models:/{name}@{alias}"
        return entry.get("uri")  # set once registered

    def flush(self) -> bool:
        """Try to send everything queued now (ignoring the retry interval). True when nothing
        is left."""
        return self._flush()

    def close(self, status: str = "FINISHED", wait_s: float | None = None) -> CloseReport:
        """End the run with `status` (FINISHED, FAILED, KILLED). Tries to send what is queued
        for up to `wait_s` (default `close_wait_s`); what is still unsent is written to
        `unsent_path` (JSONL), printed, and described in the returned report."""
        if self._closed is not None:
            return self._closed
        wait_s = self.close_wait_s if wait_s is None else wait_s
        deadline = time.monotonic() + wait_s
        status_sent = False
        while True:
            if self._flush():
                try:
                    self._call(self._client.set_terminated, self.run_id, status)
                    status_sent = True
                    self._mark_up()
                except Exception as exc:
                    if not _is_transient(exc):
                        self._rejected.append({"item": {"type": "end_run", "status": status}, "reason": _short(exc)})
                        status_sent = True  # refused, not unsent: reported as rejected
                    else:
                        self._mark_down(exc)
            if status_sent or time.monotonic() >= deadline:
                break
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        report = CloseReport(
            run_id=self.run_id, uri=self.uri, status=status,
            unsent_metrics=len(self._q_metrics), unsent_params=len(self._q_params), unsent_tags=len(self._q_tags),
            unsent_artifacts=[f.get("artifact_path") or "." for f in self._q_files],
            unsent_models=[_model_label(m) for m in self._q_models],
            status_unsent=not status_sent,
            rejected=[f"{_describe(r['item'])}: {r['reason']}" for r in self._rejected],
        )  # fmt: skip
        if report.ok:
            if self._journal_path is not None or self.unsent_path.exists():
                self.unsent_path.unlink(missing_ok=True)
            spool = self.spool_dir / f"mlflow-unsent-{self.run_id}"
            shutil.rmtree(spool, ignore_errors=True)
        else:
            self._stage_pending()
            records = self._queued_records()
            if not status_sent:
                records.append({"type": "end_run", "status": status})
            records += [{"type": "rejected", "item": r["item"], "reason": r["reason"]} for r in self._rejected]
            self._rewrite_journal(records)
            report.unsent_path = self.unsent_path
            _say(str(report), relay=False)  # the commands print the report they get (cli._print_unsent)
        self._closed = report
        return report

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._closed is None:
            # SystemExit: Ray's drivers answer SIGTERM (`ray job stop`) with sys.exit(15), and Ray
            # Train its Ctrl-C abort with sys.exit(0): the process was stopped, not failing
            stopped = exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, SystemExit))
            status = "FINISHED" if exc_type is None else "KILLED" if stopped else "FAILED"
            self.close(status)

    # --- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed is not None:
            raise RuntimeError(f"tracker of run {self.run_id} is closed")

    def _experiment_id(self, name: str) -> str:
        exp = self._client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self._client.create_experiment(name, artifact_location=_artifact_root(self.uri))
        except MlflowException as exc:  # created meanwhile by a concurrent run
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return self._client.get_experiment_by_name(name).experiment_id

    def _create_run(self, tags: dict[str, str], run_name: str | None, retry: bool):
        """The one run of this tracker's creation, whatever the retries. MLflow's create_run is
        not idempotent: a request the server carried out but whose answer was lost (a server
        killed mid-request, a timeout under load) is sent again, by MLflow's HTTP retries (every
        method) or by the open_wait_s loop, and creates a second run (a sweep under a server
        restart had 5 trial runs of 4). So each creation carries a token, the runs holding it are
        this creation's, and all but the first are deleted."""
        token = tags[CREATE_REQUEST_TAG]

        def created():
            runs = self._call(self._client.search_runs, [self.experiment_id],
                              f"tags.`{CREATE_REQUEST_TAG}` = '{token}'")
            return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))

        runs = created() if retry else []  # an earlier attempt's request may have been carried out
        if not runs:
            run = self._call(self._client.create_run, self.experiment_id, tags=tags, run_name=run_name)
            runs = created() or [run]  # a store whose searches lag its writes
        for extra in runs[1:]:
            self._call(self._client.delete_run, extra.info.run_id)
        return runs[0]

    def _call(self, fn, *args, **kwargs):
        """One MLflow call; transient failures of a non-HTTP store (a locked SQLite file) are
        retried briefly here, HTTP ones by MLflow's own (shortened) retries."""
        for attempt in range(self._local_retries + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if attempt == self._local_retries or not _is_transient(exc):
                    raise
                time.sleep(0.2 * 2**attempt)

    def _enqueue_file(self, path: Path, artifact_path: str | None, staged: bool, cleanup: bool = False) -> None:
        """cleanup: the source's parent folder is ours (a temporary or staged copy): remove it
        once uploaded."""
        entry = {
            "type": "artifacts", "local_path": str(path), "artifact_path": artifact_path,
            "staged": staged, "cleanup": cleanup or staged,
        }  # fmt: skip
        self._q_files.append(entry)
        if self._down:
            self._stage_pending()
        self._journal([entry])

    def _stage_pending(self) -> None:
        for entry in [*self._q_files, *self._q_models]:
            if entry["staged"]:
                continue
            key = "local_path" if entry["type"] == "artifacts" else "model_dir"
            source = Path(entry[key])
            base = self.spool_dir / f"mlflow-unsent-{self.run_id}" / "staged"
            base.mkdir(parents=True, exist_ok=True)
            target = Path(tempfile.mkdtemp(prefix="item-", dir=base)) / source.name
            try:
                _stage(source, target)
            except OSError as exc:
                _say(f"could not stage {source} for a later upload ({_short(exc)}); it must stay in place")
                continue
            if entry.get("cleanup"):  # our own temporary copy: the staged one replaces it
                shutil.rmtree(source.parent, ignore_errors=True)
            entry[key], entry["staged"], entry["cleanup"] = str(target), True, True
            self._journal([entry])  # the later record (staged path) wins on replay

    def _maybe_flush(self) -> None:
        if self._down and time.monotonic() < self._next_try:
            return
        self._flush()

    def _flush(self) -> bool:
        if not any(self.pending.values()):
            return True
        was_down, before = self._down, self.pending
        try:
            self._send_batch()
            self._send_files()
            self._send_models()
        except Exception as exc:
            if not _is_transient(exc):
                raise
            self._mark_down(exc)
            return False
        if was_down:
            sent = ", ".join(f"{n} {k}" for k, n in before.items() if n)
            self._mark_up(f"sent the {sent} queued")
        return True

    def _rejected_item(self, item: dict, exc: BaseException) -> None:
        self._rejected.append({"item": item, "reason": _short(exc)})
        _say(f"MLflow refused {_describe(item)} for run {self.run_id}: {_short(exc)} (reported at close)")

    def _send_batch(self) -> None:
        """The queued params, tags and metrics in one MlflowClient.log_batch, which cuts them into
        requests within MLflow's limits itself. synchronous=True whatever MLFLOW_ENABLE_ASYNC_LOGGING
        says: an item leaves the queue only once the store has taken it. Sending again after a
        failure part-way is harmless: a metric keeps its timestamp and step, a param its value."""
        records = [r for r in self._queued_records() if r["type"] in ("param", "tag", "metric")]
        if not records:
            return
        try:
            self._call(self._client.log_batch, self.run_id, **_batch(records), synchronous=True)
        except MlflowException as exc:
            if _is_transient(exc):
                raise
            # Refused: each item alone, so that one bad item (a name the store does not take, a
            # param changed in a run resumed offline) does not take the others with it.
            for record in records:
                try:
                    self._call(self._client.log_batch, self.run_id, **_batch([record]), synchronous=True)
                except MlflowException as exc1:
                    if _is_transient(exc1):
                        raise
                    self._rejected_item(record, exc1)
                if record["type"] == "metric":
                    self._q_metrics.popleft()
                else:
                    del (self._q_params if record["type"] == "param" else self._q_tags)[record["key"]]
            return
        self._q_params.clear()
        self._q_tags.clear()
        self._q_metrics.clear()

    def _send_files(self) -> None:
        while self._q_files:
            entry = self._q_files[0]
            source = Path(entry["local_path"])
            if not source.exists():
                self._rejected_item(entry, FileNotFoundError(f"{source} was removed before it could be uploaded"))
            else:
                try:
                    if source.is_dir():
                        self._call(self._client.log_artifacts, self.run_id, str(source), entry["artifact_path"])
                    else:
                        self._call(self._client.log_artifact, self.run_id, str(source), entry["artifact_path"])
                except MlflowException as exc:
                    if _is_transient(exc):
                        raise
                    self._rejected_item(entry, exc)
                if entry.get("cleanup"):
                    shutil.rmtree(source.parent, ignore_errors=True)
            self._q_files.popleft()

    def _send_models(self) -> None:
        while self._q_models:
            entry = self._q_models[0]
            try:
                if not Path(entry["model_dir"]).is_dir():
                    raise FileNotFoundError(f"{entry['model_dir']} was removed before the model was registered")
                self._register(entry)
            except (MlflowException, FileNotFoundError) as exc:
                if _is_transient(exc) and not isinstance(exc, FileNotFoundError):
                    raise
                self._rejected_item(entry, exc)
            else:
                if entry["staged"]:
                    shutil.rmtree(Path(entry["model_dir"]).parent, ignore_errors=True)
            self._q_models.popleft()

    def _register(self, entry: dict) -> None:
        """MLflow's log_model uploads the pyfunc, links it to the run at `step` and registers it
        as a new version of `name`; then the alias moves to it. The logged model it fills is
        created first, in the run's experiment: on its own, log_model would create it in the
        fluent API's experiment (the Default one, its artifacts under ./mlruns). `entry` keeps the
        model and the version once made, so that a retry after a failure goes on with them (what
        log_model does is done again, on the same logged model)."""
        if self.experiment_id is None:  # a run resumed offline
            self.experiment_id = self._call(self._client.get_run, self.run_id).info.experiment_id
        if not entry.get("model_id"):
            entry["model_id"] = self._call(
                self._client.create_logged_model, self.experiment_id, name=entry["artifact_name"],
                source_run_id=self.run_id,
            ).model_id  # fmt: skip
        if not entry.get("version"):
            # Model.log, the log_model behind mlflow.pyfunc.log_model, because it takes the run:
            # the latter logs to the fluent API's active run, which this Tracker does not use
            with _global_uris(self.uri):
                info = self._call(
                    Model.log, artifact_path=None, flavor=mlflow.pyfunc, model_id=entry["model_id"],
                    python_model=str(PYFUNC_CODE), artifacts={MODEL_DIR_ARTIFACT: entry["model_dir"]},
                    pip_requirements=_pip_requirements(), run_id=self.run_id, step=entry["step"],
                    registered_model_name=entry["name"],
                )  # fmt: skip
            entry["version"] = str(info.registered_model_version)
        if entry["alias"]:
            self._call(self._client.set_registered_model_alias, entry["name"], entry["alias"], entry["version"])
        entry["uri"] = (f"models:/{entry['name']}@{entry['alias']}" if entry["alias"]
                        else f"models:/{entry['name']}/{entry['version']}")
        self.registered.append({k: entry[k] for k in ("name", "alias", "version", "uri")})

    def _mark_down(self, exc: BaseException) -> None:
        self._next_try = time.monotonic() + self.retry_interval_s
        if self._down:
            return
        self._down = True
        self._stage_pending()
        self._journal(self._queued_records())
        queued = ", ".join(f"{n} {k}" for k, n in self.pending.items() if n) or "nothing"
        _say(
            f"MLflow unreachable at {self.uri}: {queued} queued, training continues "
            f"(run {self.run_id}; retrying every {self.retry_interval_s:g} s; journal {self.unsent_path}; "
            f"{_short(exc)})"
        )

    def _mark_up(self, detail: str = "") -> None:
        if not self._down:
            return
        self._down = False
        _say(f"MLflow reachable again at {self.uri}{f': {detail}' if detail else ''} (run {self.run_id})")
        if not any(self.pending.values()):
            self._delete_journal()
            if not self._rejected:
                shutil.rmtree(self.spool_dir / f"mlflow-unsent-{self.run_id}", ignore_errors=True)

    # --- the unsent-items journal ---------------------------------------------------------

    def _queued_records(self) -> list[dict]:
        return [
            *({"type": "param", "key": k, "value": v} for k, v in self._q_params.items()),
            *({"type": "tag", "key": k, "value": v} for k, v in self._q_tags.items()),
            *(_metric_record(m) for m in self._q_metrics),
            *self._q_files,
            *self._q_models,
        ]

    def _header(self) -> dict:
        return {"type": "run", "run_id": self.run_id, "uri": self.uri, "experiment_id": self.experiment_id}

    def _journal(self, records: list[dict]) -> None:
        """While the store is unreachable, append queued items to the journal so that a crash
        loses nothing (it may hold items sent since: replaying them is harmless)."""
        if not self._down or not records:
            return
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        new = self._journal_path is None or not self._journal_path.exists()
        self._journal_path = self.unsent_path
        with open(self._journal_path, "a") as f:
            if new:
                f.write(json.dumps(self._header()) + "\n")
            for record in records:
                f.write(json.dumps(record) + "\n")

    def _rewrite_journal(self, records: list[dict]) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.unsent_path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            for record in [self._header(), *records]:
                f.write(json.dumps(record) + "\n")
        os.replace(tmp, self.unsent_path)
        self._journal_path = self.unsent_path

    def _delete_journal(self) -> None:
        if self._journal_path is not None:
            self._journal_path.unlink(missing_ok=True)
            self._journal_path = None


def _model_label(item: dict) -> str:
    """"name@alias", or "name" for a registration that moves no alias."""
    return f"{item['name']}@{item['alias']}" if item.get("alias") else item["name"]


def alias_version(uri: str, name: str, alias: str) -> str | None:
    """The registered model version `models:/<name>@<alias>` points at, or None (none yet, or
    the store does not answer): said before and after a registration moves the alias."""
    try:
        return str(MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version_by_alias(name, alias).version)
    except Exception:  # noqa: BLE001 - no such model or alias, or an unreachable store: nothing to report
        return None


def _batch(records: list[dict]) -> dict[str, list]:
    """MlflowClient.log_batch's params, tags and metrics for journal records of them."""
    return {
        "params": [Param(r["key"], r["value"]) for r in records if r["type"] == "param"],
        "tags": [RunTag(r["key"], r["value"]) for r in records if r["type"] == "tag"],
        "metrics": [Metric(r["key"], r["value"], r["timestamp"], r["step"]) for r in records if r["type"] == "metric"],
    }


def _metric_record(m: tuple[str, float, int, int]) -> dict:
    return {"type": "metric", "key": m[0], "value": m[1], "timestamp": m[2], "step": m[3]}


def _describe(item: dict) -> str:
    kind = item.get("type")
    if kind == "metric":
        return f"metric {item['key']}={item['value']} at step {item['step']}"
    if kind in ("param", "tag"):
        return f"{kind} {item['key']}"
    if kind == "artifacts":
        return f"artifacts {item.get('artifact_path') or '.'} from {item['local_path']}"
    if kind == "register_model":
        return f"model registration {_model_label(item)}"
    if kind == "end_run":
        return f"the final status {item.get('status')}"
    return str(kind)


def read_unsent(path: str | Path) -> tuple[dict, list[dict]]:
    """(header, records) of an unsent-items file; later records of the same param, tag,
    artifact or model replace earlier ones (a journal may name an item twice)."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines or lines[0].get("type") != "run":
        raise ValueError(f"{path}: not an MLflow unsent-items file (no run header)")
    header, records = lines[0], []
    seen: dict[tuple, int] = {}
    for record in lines[1:]:
        kind = record.get("type")
        if kind in ("param", "tag"):
            key = (kind, record["key"])
        elif kind == "artifacts":
            key = (kind, record.get("artifact_path"), Path(record["local_path"]).name)
        elif kind == "register_model":
            key = (kind, record["name"], record["alias"], Path(record["model_dir"]).name)
        else:
            key = None
        if key is not None and key in seen:
            records[seen[key]] = record
        else:
            if key is not None:
                seen[key] = len(records)
            records.append(record)
    return header, records


def replay_unsent(path: str | Path, uri: str | None = None, close_wait_s: float = 10.0) -> CloseReport:
    """Send an unsent-items file (written by `Tracker.close` or left by a crash) to its run,
    at `uri` or the URI it names; ends the run with the status it names (default FINISHED).
    The file is removed when everything went through; else it is rewritten with the rest."""
    path = Path(path)
    header, records = read_unsent(path)
    tracker = Tracker(
        experiment="", uri=uri or header["uri"], run_id=header["run_id"], spool_dir=path.parent,
        retry_interval_s=0.0, close_wait_s=close_wait_s,
    )  # fmt: skip
    status = "FINISHED"
    for record in records:
        kind = record["type"]
        if kind == "metric":
            metric = (record["key"], float(record["value"]), int(record["timestamp"]), int(record["step"]))
            tracker._q_metrics.append(metric)
        elif kind == "param":
            tracker._params[record["key"]] = tracker._q_params[record["key"]] = record["value"]
        elif kind == "tag":
            tracker._q_tags[record["key"]] = record["value"]
        elif kind == "artifacts":
            tracker._q_files.append(dict(record))
        elif kind == "register_model":
            tracker._q_models.append(dict(record))
        elif kind == "end_run":
            status = record["status"]
        # "rejected" records were refused by the server: not sent again
    return tracker.close(status)
