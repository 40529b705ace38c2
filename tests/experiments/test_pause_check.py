"""experiments/pause_check.py on CPUs, on the session's Ray cluster: the paused and relaunched
run is the straight one, loss for loss and weight for weight (the GPU check reads the same table);
a second call reads the finished runs instead of training them again."""

from tests.experiments import experiment

pause_check = experiment("pause_check")


def test_a_paused_run_prints_the_straight_runs_losses_and_weights(ray_cluster, tmp_path, capsys):
    args = ["--out", str(tmp_path), "--entities", "300", "--steps", "8", "--log-every", "4", "--batch", "16",
            "--straight", "1", "--pauses", "1"]
    assert pause_check.main(args) == 0
    out = capsys.readouterr().out
    assert "paused run: paused at step 4" in out, out
    head, rule, straight, paused = [line for line in out.splitlines() if line.startswith("|")]
    assert head.startswith("| run | loss at step 4 | loss at step 8 | largest weight difference"), head
    cells = {row.split(" | ")[0]: row.strip(" |").split(" | ")[1:] for row in (straight, paused)}
    assert cells["| straight-1"][:2] == cells["| paused"][:2] and all(float(x) > 0 for x in cells["| paused"][:2]), out
    assert cells["| paused"][2].startswith("0 ("), out
    assert pause_check.main(args) == 0  # the next device call: both runs finished, nothing trained
    again = capsys.readouterr().out
    assert "paused run:" not in again and [x for x in again.splitlines() if x.startswith("|")] == [head, rule, straight, paused], again


def test_the_store_is_a_file_store_where_sqlalchemy_is_missing(tmp_path, monkeypatch):
    """The GPU machine's carried wheels hold no SQLAlchemy, and MLflow there refused the check's
    sqlite URI (round 24's first attempt): without it the check logs to a file store."""
    assert pause_check.store(tmp_path) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    find_spec = pause_check.importlib.util.find_spec
    monkeypatch.setattr(pause_check.importlib.util, "find_spec", lambda name, *a: None if name == "sqlalchemy" else find_spec(name, *a))
    assert pause_check.store(tmp_path) == (tmp_path / "mlruns").as_uri()
