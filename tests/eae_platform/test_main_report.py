"""The main job's closing report (eae_platform.main_report) on the session's tiny model
pretrained on the synthetic world: its figures against counts made here from the shards."""

import json
import re
from collections import Counter

from eae_platform import main_report


def test_the_report_links_dev_mentions_beside_the_most_frequent_entity(synth_pretrained, capsys):
    tmp, summary, uri = synth_pretrained
    code = main_report.main(["--model", str(tmp / "model"), "--data", str(tmp / "data"), "--checkpoints",
                             str(tmp / "ray" / "world"), "--mlflow-uri", uri, "--seconds", "75"])
    out = capsys.readouterr().out
    assert code == 0, out
    n = json.loads((tmp / "model" / "config.json").read_text())["num_entities"]
    train = Counter(i for _, spans in main_report.linked_mentions(str(tmp / "data"), "train", n) for *_, i in spans)
    gold = [i for _, spans in main_report.linked_mentions(str(tmp / "data"), "dev", n) for *_, i in spans]
    top, _ = train.most_common(1)[0]
    m = re.search(r"(\d+) mentions: model ([\d.]+)% \((\d+)\), most-frequent-entity baseline ([\d.]+)%", out)
    assert m, out
    mentions, accuracy, correct, baseline = int(m[1]), float(m[2]), int(m[3]), float(m[4])
    assert mentions == len(gold) > 20  # every linked dev mention, given its span
    assert baseline == round(100 * sum(g == top for g in gold) / len(gold), 1)
    assert accuracy == round(100 * correct / mentions, 1)
    assert accuracy > baseline + 10, out  # 150 steps on this world link far better than one guess
    assert "=== main job: 1.2 minutes ===" in out and "for 150 steps of 32 contexts on 1 Ray Train workers" in out
    assert "better, though far from good" in out and "a dev sentence, linked by the model:" in out
    assert f"MLflow run:  {summary['mlflow_run_id']} in {uri}" in out
