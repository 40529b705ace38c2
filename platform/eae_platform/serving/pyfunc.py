"""The registered model's code, logged with it as an MLflow model from code: MLflow runs this
file when it loads the model (`mlflow.pyfunc.load_model`), so loading never unpickles anything
(a pickled PythonModel runs whatever code its pickle names). `eae_platform.tracking` logs it.

predict is the serving engine's linking (engine.py), the answer of POST /v1/link: a text longer
than the model's max_length is cut into windows, never truncated, so a registered model and
`eae serve` give one text one answer."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow.models
import mlflow.pyfunc

from eae_platform.tracking import MODEL_DIR_ARTIFACT


TAKES = 'the EaE pyfunc takes a str, a list of str, {"text": str | list[str]} or a DataFrame with a "text" column'


def texts_of(model_input: Any) -> list[str]:
    """A str, a list of str, {"text": str | list[str]}, or a DataFrame with a "text" column (else
    its only one) -> the list of texts."""
    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, Mapping):
        if "text" not in model_input:
            raise ValueError(f"{TAKES}; got a mapping without 'text' (keys: {', '.join(map(str, model_input))})")
        model_input = model_input["text"]
        if isinstance(model_input, str):
            return [model_input]
    elif hasattr(model_input, "columns"):
        column = model_input["text"] if "text" in model_input.columns else model_input.iloc[:, 0]
        return [str(t) for t in column.tolist()]
    # not str(t): a record ({"text": ...}) or a number would be linked as its repr
    wrong = [type(t).__name__ for t in model_input if not isinstance(t, str)]
    if wrong:
        raise ValueError(f"{TAKES}; got a list holding a {wrong[0]}")
    return list(model_input)


# Defined with warnings recorded (and dropped): MLflow warns at class creation that predict has
# no type hints. Hints would make MLflow validate and convert inputs (list[str] refuses a str or
# {"text": ...}); without them the input reaches predict as given.
with warnings.catch_warnings(record=True):

    class EaEPyfuncModel(mlflow.pyfunc.PythonModel):
        """MLflow pyfunc of a saved EaE model directory (`model.safetensors` + `config.json`, and
        the entity vocabulary beside them), held among the pyfunc's artifacts.

        After `m = mlflow.pyfunc.load_model("models:/eae@champion")`,
        `m.unwrap_python_model().model_dir` is the local directory and `.engine` the serving
        Engine on it. predict takes texts (see `texts_of`) and returns, per text, what
        POST /v1/link answers: {"text", "mentions": [{"start", "end", "text", "entity_id",
        "title", "score", "md_conf", "candidates"}]}, character offsets, 5 candidates."""

        def load_context(self, context) -> None:
            from eae_platform.serving.engine import Engine
            from eae_platform.serving.model_source import resolve

            self.model_dir = Path(context.artifacts[MODEL_DIR_ARTIFACT])
            self.engine = Engine(resolve(str(self.model_dir)))

        def predict(self, context, model_input, params=None) -> list[dict]:
            """One batch for all texts (Engine.run: as many windows as they need); a text the
            API refuses (empty, too long) raises its RequestError, a ValueError."""
            engine = self.engine
            prepared = [engine.prepare(engine.link_job(text)) for text in texts_of(model_input)]
            return engine.run(prepared) if prepared else []


mlflow.models.set_model(EaEPyfuncModel())
