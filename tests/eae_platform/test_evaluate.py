"""The evaluation suite (`eae eval`) on the session's tiny model pretrained on the synthetic
world (`synth_pretrained`, tests/conftest.py): every number is compared with the same
evaluation of an untrained model of the same shape, with an exact identity (K above the
entity count is K = all), or with a hand-computed baseline. The official formats (LAMA jsonl,
Open Entity, TACRED) are read from small hand-made files in those formats."""

import dataclasses
import json
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from eae_data.constants import VOCAB_FILES
from eae_data.qa.resolve import AnswerResolver
from eae_data.tokenizer import WordPieceTokenizer
from eae_model.checkpoint import load_model, save_model
from eae_model.metrics import add_masked_prediction, masked_prediction_metrics
from eae_model.model import EaEModel
from eae_platform import cli
from eae_platform.evaluate import analysis, common, entity_typing, lama, masked, relations
from eae_platform.evaluate.config import load_eval_config
from eae_platform.evaluate.probes import expand_quiz, load_probes


@pytest.fixture(scope="module")
def untrained(synth_pretrained):
    """A model directory of the pretrained model's shape, freshly initialised, same vocabulary."""
    tmp, _, _ = synth_pretrained
    out = tmp / "untrained"
    if not (out / "config.json").is_file():
        torch.manual_seed(0)
        save_model(EaEModel(load_model(tmp / "model").config), out)
        for name in VOCAB_FILES:
            shutil.copyfile(tmp / "model" / name, out / name)
    return out


def _metrics(uri, run_name):
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("eae-eval").experiment_id],
                               filter_string=f"attributes.run_name = '{run_name}'")
    return run


def test_masked_metrics_give_the_model_no_entity_ids_and_score_as_the_model_given_them(synth_pretrained):
    """The metrics need no loss, so masked_metrics gives the model the spans without their
    entity ids (the linking losses' softmax over all N entities was ~90% of its GPU time at 100k
    entities: benchmarks/bench_eval_shapes.py); the figures are those of the model given them."""
    tmp, _, _ = synth_pretrained
    model = load_model(tmp / "model")
    batches = list(masked.split_batches(str(tmp / "data"), "dev", 16, 0, 0.2, model.config.num_entities))
    given = []
    hook = model.register_forward_pre_hook(lambda mod, args, kwargs: given.append(kwargs["mentions"].entity_ids),
                                           with_kwargs=True)
    got = masked.masked_metrics(model, batches, torch.device("cpu"))
    hook.remove()
    assert len(given) == len(batches) and all(ids is None for ids in given)
    sums = defaultdict(float)
    with torch.no_grad():
        for b in batches:  # the loop before: the model given the entity ids, its losses computed
            out = model(b.input_ids, b.attention_mask, mentions=b.mentions, mlm_labels=b.mlm_labels)
            assert "entity_pred" in out.losses
            add_masked_prediction(sums, model, out, b.input_ids, b.mentions, b.mlm_labels)
    want = {"tokens": sums["tokens"], "entities": sums["entities"], **masked_prediction_metrics(sums)}
    assert want["entities"] > 20 and want["entity_accuracy"] > 0
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], rel=1e-6) for k in want), (got, want)


def test_masked_and_topk_through_the_cli(synth_pretrained, untrained, capsys):
    tmp, _, uri = synth_pretrained
    code = cli.main(["eval", "masked", "--model", "models:/eae-world@pretrained", "--data", str(tmp / "data"),
                     "--split", "dev", "--set", f"eval.mlflow_uri={uri}", "--set", "eval.run_name=masked-world",
                     "--set", "eval.mask_draws=3"])
    assert code == 0, capsys.readouterr()
    run = _metrics(uri, "masked-world")
    m = run.data.metrics
    assert run.data.tags["eae.task"] == "eval/masked" and run.data.params["eval.mask_draws"] == "3"
    assert m["dev/entities"] > 50 and m["dev/tokens"] > m["dev/entities"]
    base = masked.evaluate_split(load_model(untrained), str(tmp / "data"), "dev", torch.device("cpu"), mask_draws=3)
    assert base["entities"] == m["dev/entities"]  # the same masks
    assert m["dev/entity_accuracy"] > base["entity_accuracy"] + 0.05, (m, base)
    assert m["dev/perplexity"] < base["perplexity"] and m["dev/token_accuracy"] >= base["token_accuracy"]

    code = cli.main(["eval", "topk", "--model", str(tmp / "model"), "--data", str(tmp / "data"), "--split", "dev",
                     "--ks", "1,100000,all", "--qa-data", f"synth:{tmp / 'world'}", "--set", f"eval.mlflow_uri={uri}",
                     "--set", "eval.run_name=topk-world"])
    assert code == 0, capsys.readouterr()
    m = _metrics(uri, "topk-world").data.metrics
    for metric in ("entity_accuracy", "token_accuracy", "perplexity", "qa_em"):
        assert m[f"topk/100000/{metric}"] == m[f"topk/all/{metric}"]  # K >= N retrieves every entity
        assert 0 <= m[f"topk/1/{metric}"] and f"topk/1/{metric}" in m
    assert m["topk/1/perplexity"] != m["topk/all/perplexity"]  # K = 1 reads one entity per mention
    assert m["data/qa_questions"] > 40
    capsys.readouterr()
    assert cli.main(["compare", "topk-world", "--mlflow-uri", uri]) == 0
    table = capsys.readouterr().out
    assert "Top-K retrieval at inference" in table and f"| all | {100 * m['topk/all/entity_accuracy']:.1f} |" in table


def test_lama_probes(synth_pretrained, untrained, tmp_path):
    tmp, _, uri = synth_pretrained
    lama_file = tmp_path / "P36.jsonl"
    lama_file.write_text("\n".join([
        json.dumps({"sub_label": "Drova", "obj_label": "Paris", "predicate_id": "P36",
                    "evidences": [{"masked_sentence": "The capital of Drova is [MASK] ."}]}),
        json.dumps({"obj_label": "Paris", "masked_sentences": ["[MASK] is the capital of France, not [MASK] ."]}),
        json.dumps({"sub_label": "x", "masked_sentences": ["no answer [MASK] ."]}),
        "{not json",
        json.dumps({"obj_label": "Lyon", "masked_sentences": ["Lyon lies in [MASK] ."], "pred": "/people/x/P131"}),
    ]))
    probes = load_probes(f"lama:{lama_file}")
    assert sorted((p.relation, p.text, p.answer, p.subject) for p in probes.probes) == [
        ("P131", "Lyon lies in [MASK] .", "Lyon", ""), ("P36", "The capital of Drova is [MASK] .", "Paris", "Drova")]
    assert probes.skipped == {"lama/no_single_mask_sentence": 1, "lama/no_obj_label": 1, "lama/bad_json": 1}

    real = load_probes("geonames,countryinfo,wordnet,bsdgames", max_per_relation=100_000)
    facts = {(p.source, p.relation, p.subject, p.answer) for p in real.probes}
    assert ("geonames", "capital", "France", "Paris") in facts
    assert ("bsdgames", "capital", "Austria", "Vienna") in facts
    assert ("countryinfo", "region", "Japan", "Asia") in facts
    assert any(p.source == "wordnet" and p.subject == "Mississippi" and p.answer == "river" for p in real.probes)
    # real probes' prior-only baseline: the most frequent answer among the probes asked the same
    # way (the text with its subject blanked), not per relation: a WordNet probe's relation is its answer
    answers = defaultdict(Counter)
    for p in real.probes:
        answers[p.text.replace(p.subject, "[X]")][p.answer] += 1
    assert all(answers[p.text.replace(p.subject, "[X]")][p.prior] == max(answers[p.text.replace(p.subject, "[X]")].values())
               for p in real.probes)
    assert {p.prior for p in real.probes if (p.source, p.relation) == ("countryinfo", "region")} == {"Africa"}
    assert {p.prior for p in real.probes if p.source == "wordnet" and " is a " in p.text} == {"city"}
    assert expand_quiz("Andorra la V[ell|iej]a") == ["Andorra la Vella", "Andorra la Vieja"]
    assert expand_quiz("Del{aware}") == ["Del", "Delaware"]

    results = {}
    for name, model in (("pretrained", tmp / "model"), ("untrained", untrained)):
        config = load_eval_config(None, [f"eval.mlflow_uri={uri}", f"eval.run_name=lama-{name}"], task="lama",
                                  model=str(model), data=f"synth:{tmp / 'world'},lama:{lama_file}")
        results[name] = lama.run(config)
    m, base = results["pretrained"]["metrics"], results["untrained"]["metrics"]
    assert m["lama/synth/entity_probes"] == m["lama/synth/probes"] > 500  # every synthetic answer is an entity
    assert m["lama/synth/entity_accuracy"] > base["lama/synth/entity_accuracy"] + 0.05, (m, base)
    assert m["lama/lama/probes"] == 2 and m["lama/lama/entity_probes"] == 0  # real places: not in this vocabulary
    rows = results["pretrained"]["rows"]
    assert sum(r["entity_correct"] for r in rows if r["source"] == "synth") == round(
        m["lama/synth/entity_accuracy"] * m["lama/synth/probes"])
    # the memory's reads: at the subject's mention it finds the subject far above chance
    assert m["lama/synth/memory_subject_accuracy"] > base["lama/synth/memory_subject_accuracy"] + 0.2, (m, base)
    assert 0 <= m["lama/synth/memory_answer_accuracy"] <= 1


def test_memory_off_removes_what_the_memory_adds_and_nothing_else(synth_pretrained, tmp_path):
    """eval.memory_off: every prediction equals the same model's with W_b zeroed (X2 = 0), the
    memory's reads are unchanged, and the predictions differ from the model's own;
    eval.memory_off_run gives both runs from one process."""
    tmp, _, uri = synth_pretrained
    runs = {}
    for name, off in (("on", "false"), ("off", "true")):
        config = load_eval_config(None, [f"eval.mlflow_uri={uri}", f"eval.run_name=lama-memory-{name}",
                                         f"eval.memory_off={off}"], task="lama", model=str(tmp / "model"),
                                  data=f"synth:{tmp / 'world'}")
        runs[name] = lama.run(config)
    assert _metrics(uri, "lama-memory-off").data.params["eval.memory_off"] == "true"
    zeroed = load_model(tmp / "model")
    with torch.no_grad():
        zeroed.entity_memory.project_value.weight.zero_()
    probes = load_probes(f"synth:{tmp / 'world'}", config.max_per_relation, config.seed)
    resolver = AnswerResolver.from_dir(tmp / "model")
    encoded = lama.encode_probes(probes.probes, WordPieceTokenizer(), zeroed.config.max_length, resolver.entity_id, Counter())
    reference = lama.score(zeroed, encoded, torch.device("cpu"))
    on, off = runs["on"]["rows"], runs["off"]["rows"]
    assert [r["token_prediction"] for r in off] == [r["token_prediction"] for r in reference]
    assert [r.get("entity_prediction") for r in off] == [r.get("entity_prediction") for r in reference]
    assert [r.get("memory_subject_correct") for r in off] == [r.get("memory_subject_correct") for r in on]
    changed = sum((a["token_prediction"], a.get("entity_prediction")) != (b["token_prediction"], b.get("entity_prediction"))
                  for a, b in zip(on, off))
    assert changed > 0  # the memory's output reaches this model's predictions
    no_memory = tmp_path / "no-memory"
    save_model(EaEModel(dataclasses.replace(zeroed.config, use_entity_memory=False)), no_memory)
    with pytest.raises(ValueError, match="has no entity memory"):
        common.load(str(no_memory), uri, torch.device("cpu"), memory_off=True)
    # eval.memory_off_run: both evaluations from one load, as two runs that equal the two above
    both = lama.run(load_eval_config(None, [f"eval.mlflow_uri={uri}", "eval.run_name=lama-both",
                                            "eval.memory_off_run=lama-both-off"], task="lama",
                                     model=str(tmp / "model"), data=f"synth:{tmp / 'world'}"))
    assert both["rows"] == on and both["memory_off"]["rows"] == off
    assert both["memory_off"]["metrics"] == runs["off"]["metrics"] and both["metrics"] == runs["on"]["metrics"]
    params = _metrics(uri, "lama-both-off").data.params
    assert params["eval.memory_off"] == "true" and params["eval.memory_off_run"] == ""
    assert _metrics(uri, "lama-both").data.params["eval.memory_off"] == "false"
    # a model without a memory is refused before any run is logged; memory_off_run is lama's alone
    nothing = [f"eval.mlflow_uri={uri}", "eval.run_name=lama-none", "eval.memory_off_run=lama-none-off"]
    with pytest.raises(ValueError, match="memory_off_run: .* has no entity memory"):
        lama.run(load_eval_config(None, nothing, task="lama", model=str(no_memory), data=f"synth:{tmp / 'world'}"))
    client = MlflowClient(uri)
    assert not client.search_runs([client.get_experiment_by_name("eae-eval").experiment_id],
                                  filter_string="attributes.run_name LIKE 'lama-none%'")
    for bad in (["eval.memory_off_run=x"], ["eval.memory_off_run=x", "eval.memory_off=true"]):
        with pytest.raises(ValueError, match="memory_off_run is for task lama with its memory on"):
            load_eval_config(None, bad, task="masked" if len(bad) == 1 else "lama")
    with pytest.raises(ValueError, match="qa_model is scored on qa_data: give qa_data too"):
        load_eval_config(None, [], task="topk", qa_model="runs/qa/eae")
    assert load_eval_config(None, [], task="topk", qa_model="runs/qa/eae", qa_data="synth:w").qa_data == "synth:w"


def _write_openentity(directory):
    directory.mkdir()
    ufet = [{"left_context_token": ["Yesterday", ","], "mention_span": "Drova", "right_context_token": ["won", "."],
             "y_str": ["location", "country", "place"]},
            {"left_context_token": [], "mention_span": "she", "right_context_token": ["left"], "y_str": ["woman"]}]
    for split in ("train", "dev"):
        (directory / f"{split}.json").write_text("\n".join(json.dumps(r) for r in ufet) + "\n")
    (directory / "test.json").write_text(json.dumps([{"sent": "The river Vara flows.", "start": 10, "end": 14,
                                                      "labels": ["location", "object", "river"]}]))


def test_typing_and_relation_extraction(synth_pretrained, tmp_path):
    tmp, _, uri = synth_pretrained
    spec = f"synth:{tmp / 'world'},{tmp / 'data'}"
    common = [f"eval.mlflow_uri={uri}", "eval.steps=40", "eval.batch_size=16", "eval.lr=2e-3", "eval.max_examples=300"]
    typing = entity_typing.run(load_eval_config(None, common, task="typing", model=str(tmp / "model"), data=spec))
    data, _ = entity_typing.load_typing(spec, 128, 300)
    gold = sum(len(types) for _, _, types in data["test"])
    every_type = 2 * gold / (len(data["test"]) * len(typing["labels"]) + gold)  # F1 of predicting all types
    assert typing["metrics"]["test/micro_f1"] > every_type + 0.1, (typing["metrics"], every_type)
    assert "person" in typing["labels"] and "city" in typing["labels"]

    rel = relations.run(load_eval_config(None, common, task="relations", model=str(tmp / "model"), data=spec))
    assert rel["counts"]["data/test_related"] > 10 and "born_in" in rel["labels"]
    # a context plus four markers over max_length is cut to a window around the pair
    assert relations.fit_window(130, 120, 129, 122) == (8, 130) and relations.fit_window(100, 0, 99, 122) == (0, 100)
    assert relations.fit_window(300, 0, 200, 122) is None
    # predicting the most frequent relation for every pair
    data, _ = relations.load_relations(spec, 128, 300, 0)
    gold = [r for *_, r in data["test"]]
    top = max(set(gold) - {relations.NO_RELATION}, key=gold.count)
    assert rel["metrics"]["test/f1"] > relations.f1_score([top] * len(gold), gold)["f1"] + 0.1, rel["metrics"]

    # the official formats
    _write_openentity(tmp_path / "oe")
    oe, skipped = entity_typing.load_typing(f"openentity:{tmp_path / 'oe'}", 64, 100)
    assert skipped["no_general_type"] == 2  # "woman" only, in train and dev
    from eae_data.tokenizer import WordPieceTokenizer

    tok = WordPieceTokenizer()
    ids, (s, t), labels = oe["train"][0]
    assert labels == ["location", "place"] and tok.decode(ids[s : t + 1]) == "drova"
    ids, (s, t), labels = oe["test"][0]
    assert labels == ["location", "object"] and tok.decode(ids[s : t + 1]) == "vara"
    tacred = tmp_path / "tacred.json"
    tacred.write_text(json.dumps([{"id": "1", "relation": "per:city_of_birth", "token": ["Ada", "was", "born", "in",
                                   "-LRB-", "old", "-RRB-", "London", "."], "subj_start": 0, "subj_end": 0,
                                   "obj_start": 7, "obj_end": 7},
                                  {"id": "2", "relation": "no_relation", "token": ["a"], "subj_start": 0, "subj_end": 0,
                                   "obj_start": 0, "obj_end": 0}]))
    examples, skipped = relations.load_relations(f"tacred:{tacred},{tacred},{tacred}", 64, 100, 0)
    assert skipped["bad_spans"] == 3  # overlapping subject and object, once per split
    ids, a, b, relation = examples["train"][0]
    assert relation == "per:city_of_birth" and tok.decode(ids[a + 1 : ids.index(tok.token_to_id("[unused1]"))]) == "ada"
    assert ids[a] == tok.token_to_id("[unused0]") and ids[b] == tok.token_to_id("[unused2]")
    assert "( old )" in tok.decode(ids) and tok.decode([ids[b + 1]]) == "london"


def test_analysis_plots_and_overlap_of_two_qa_runs(synth_pretrained, capsys):
    from eae_platform.finetune.config import load_finetune_config
    from eae_platform.finetune.qa import finetune

    tmp, _, uri = synth_pretrained
    for name, lr in (("qa-eval-a", 1e-3), ("qa-eval-b", 3e-4)):
        finetune(load_finetune_config(None, [f"finetune.mlflow_uri={uri}", f"finetune.run_name={name}",
                                             "finetune.log_every=50", "finetune.evaluate_test=false"],
                                      init=str(tmp / "model"), data=f"synth:{tmp / 'world'}", max_steps=40, lr=lr))
    common = ["--runs", "qa-eval-a,qa-eval-b", "--split", "dev", "--set", f"eval.mlflow_uri={uri}"]
    assert cli.main(["eval", "analysis", "--data", str(tmp / "data"), *common, "--set", "eval.bootstrap=200",
                     "--set", "eval.run_name=analysis-world"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    run = _metrics(uri, "analysis-world")
    client = MlflowClient(uri)
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/answer_frequency.png", "plots/question_mentions.png", "plots/question_length.png"} <= plots
    # the command says where the plots are (they were only the run's artifacts, found in the UI): this
    # SQLite store's are a local directory, next to its database
    pngs = "answer_frequency.png, question_mentions.png, question_length.png, analysis.json"
    [where] = [line for line in out.splitlines() if line.startswith("plots:")]
    where, listed = where.removeprefix("plots:").strip().rsplit("  ", 1)
    assert listed == f"({pngs})", out
    assert Path(where).is_relative_to(tmp.resolve() / "mlartifacts") and run.info.run_id in Path(where).parts, out
    assert sorted(p.name for p in Path(where).iterdir()) == sorted(pngs.split(", ")), out
    assert (Path(where) / "question_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    local = client.download_artifacts(run.info.run_id, "plots/answer_frequency.png")
    assert open(local, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    m = run.data.metrics
    predictions = analysis.load_predictions(["qa-eval-a"], "dev", uri)["qa-eval-a"]
    for view in ("answer_frequency", "question_length", "question_mentions"):
        n = sum(v for k, v in m.items() if k.startswith(f"analysis/qa-eval-a/{view}/") and k.endswith("/n"))
        assert n == len(predictions)  # every dev answer resolves in this world: every question has a bucket
    for key, value in m.items():
        if key.endswith("/accuracy"):
            assert m[key[: -len("accuracy")] + "low"] <= value <= m[key[: -len("accuracy")] + "high"]
    # every synthetic question names its subject, an entity of the vocabulary: few have no mention
    assert m.get("analysis/qa-eval-a/question_mentions/0/n", 0) < 0.2 * len(predictions)

    capsys.readouterr()
    assert cli.main(["eval", "overlap", *common, "--set", "eval.run_name=overlap-world"]) == 0, capsys.readouterr()
    assert "evaluating overlap: runs qa-eval-a,qa-eval-b (split dev)\n" in capsys.readouterr().out
    m = _metrics(uri, "overlap-world").data.metrics
    a = client.get_run(_qa_run_id(client, "qa-eval-a")).data.metrics["dev/em"]
    b = client.get_run(_qa_run_id(client, "qa-eval-b")).data.metrics["dev/em"]
    assert m["overlap/a_em"] == pytest.approx(a) and m["overlap/b_em"] == pytest.approx(b)
    assert max(a, b) <= m["overlap/oracle_accuracy"] <= a + b and m["overlap/both_correct"] <= min(a, b)
    same = analysis.overlap(predictions, predictions)
    assert same["overlap/prediction_overlap"] == 1.0 and same["overlap/oracle_accuracy"] == pytest.approx(a)


def _qa_run_id(client, name):
    [run] = client.search_runs([client.get_experiment_by_name("eae-qa").experiment_id],
                               filter_string=f"attributes.run_name = '{name}'")
    return run.info.run_id


def test_bad_eval_input_is_a_clear_error(synth_pretrained, capsys):
    tmp, _, uri = synth_pretrained
    assert cli.main(["eval", "lama", "--model", str(tmp / "model"), "--data", "squad:x"]) == 2
    assert "unknown probe source 'squad'" in capsys.readouterr().err
    assert cli.main(["eval", "topk", "--model", str(tmp / "model"), "--ks", "1,0"]) == 2
    assert "ks must be positive integers or 'all'" in capsys.readouterr().err
    assert cli.main(["eval", "overlap", "--runs", "only-one", "--set", f"eval.mlflow_uri={uri}"]) == 2
    assert "exactly 2" in capsys.readouterr().err
    assert cli.main(["eval", "masked", "--model", str(tmp / "model"), "--data", str(tmp / "world")]) == 2
    assert "no test shards" in capsys.readouterr().err


def test_synth_probes_are_split_by_what_pretraining_read(synth_pretrained):
    """eval.stated_in: a fact is "stated" exactly when its subject's article went to the
    training shards (read back from the shards' article titles), and each probe's prior is its
    relation's most frequent answer among the stated facts."""
    import collections

    import pyarrow.parquet as pq

    tmp, _, _ = synth_pretrained
    trained = {t for f in (tmp / "data" / "shards" / "train").glob("*.parquet")
               for t in pq.read_table(f, columns=["article_title"]).column(0).to_pylist()}
    probes = load_probes(f"synth:{tmp / 'world'}", max_per_relation=100_000, stated_in=str(tmp / "data")).probes
    facts = [json.loads(x) for x in (tmp / "world" / "facts.jsonl").read_text().splitlines()]
    names = {e["id"]: e["name"] for e in map(json.loads, (tmp / "world" / "entities.jsonl").read_text().splitlines())}
    assert len(probes) == len(facts)
    expected = collections.Counter((names[f["subject_id"]], f["relation"], "stated" if f["subject"] in trained else "unstated")
                                   for f in facts)
    assert collections.Counter((p.subject, p.relation, p.group) for p in probes) == expected
    assert 0 < expected.total() - sum(n for k, n in expected.items() if k[2] == "stated") < expected.total()
    answers = collections.defaultdict(collections.Counter)
    for f in facts:
        if f["subject"] in trained:
            answers[f["relation"]][f["object"]] += 1
    for p in probes:
        assert answers[p.relation][p.prior] == max(answers[p.relation].values())


def test_lama_groups_and_prior_baseline_are_counted_per_group():
    """lama.aggregate on hand-made rows: accuracy and the prior-only baseline per group."""
    def row(group, correct, prior):
        return {"source": "synth", "relation": "born_in", "group": group, "token_correct": False,
                "entity_correct": correct, "prior_correct": prior}

    rows = [row("stated", True, False), row("stated", True, True), row("stated", False, True), row("stated", False, False),
            row("unstated", False, True)]
    m = lama.aggregate(rows)
    assert m["lama/synth/stated/entity_accuracy"] == 2 / 4 and m["lama/synth/stated/prior_entity_accuracy"] == 2 / 4
    assert m["lama/synth/unstated/entity_accuracy"] == 0 and m["lama/synth/unstated/prior_accuracy"] == 1
    assert m["lama/synth/entity_accuracy"] == 2 / 5 and m["lama/synth/prior_accuracy"] == 3 / 5
    read = [{**row("stated", True, None), "memory_subject_correct": c, "memory_answer_correct": False}
            for c in (True, True, False)]
    assert lama.aggregate(read)["lama/synth/stated/memory_subject_accuracy"] == 2 / 3
    assert lama.aggregate(read)["lama/synth/memory_answer_accuracy"] == 0
    assert "lama/synth/memory_subject_accuracy" not in m  # No-EaE rows carry no memory reads
    other = [{**row("", True, None), "source": "geonames"}]
    assert "lama/geonames/prior_accuracy" not in lama.aggregate(other)  # rows without a prior: no baseline


def test_a_task_without_its_model_or_data_names_the_flag(tmp_path, capsys):
    """Not the task's own words for what is missing ("finetune.init is empty", "no test shards
    under /shards/test"): the flag to give."""
    assert cli.main(["eval", "masked", "--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("eae: error: eval masked needs a model: --model (eval.model)")
    assert cli.main(["eval", "topk", "--model", "models:/eae@pretrained"]) == 2
    assert capsys.readouterr().err.startswith("eae: error: eval topk needs data: --data (eval.data)")


def test_a_data_path_that_is_not_there_is_named_as_given(tmp_path, capsys):
    """Before the task: the data directory, a source's file or directory, every file of a
    dataset of several (its later ones were found missing only after Ray had started), and
    --qa-data's files (the tasks said "no test shards under ...", "LAMA file ... not found",
    after Ray started)."""
    model = ["--model", "models:/eae@pretrained", "--set", f"eval.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    (tmp_path / "train.json").write_text("[]")
    (tmp_path / "world").mkdir()
    for args, said in (
        (["masked", "--data", str(tmp_path / "data")], f"--data {tmp_path / 'data'}: not found (give an `eae data build`"),
        (["lama", "--data", f"geonames,lama:{tmp_path / 'P19.jsonl'}"], f"--data lama:{tmp_path / 'P19.jsonl'}: not found"),
        (["relations", "--data", f"tacred:{tmp_path / 'nowhere.json'},dev.json,test.json"],
         f"--data tacred:{tmp_path / 'nowhere.json'}: not found"),
        (["relations", "--data", f"tacred:{tmp_path / 'train.json'},{tmp_path / 'dev.json'},{tmp_path / 'train.json'}"],
         f"--data {tmp_path / 'dev.json'}: not found\n"),
        (["relations", "--data", f"tacred:{tmp_path / 'train.json'},{tmp_path / 'train.json'},{tmp_path / 'test.json'}"],
         f"--data {tmp_path / 'test.json'}: not found\n"),
        (["typing", "--data", f"synth:{tmp_path / 'world'},{tmp_path / 'data'}"], f"--data {tmp_path / 'data'}: not found\n"),
        (["typing", "--data", f"wiki:{tmp_path / 'world'},{tmp_path / 'data.noun'}"], f"--data {tmp_path / 'data.noun'}: not found\n"),
        (["topk", "--data", str(tmp_path), "--qa-data", f"synth:{tmp_path / 'world'}"],
         f"{tmp_path / 'world' / 'questions.jsonl'}: not found"),
    ):
        assert cli.main(["eval", *args, *model]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"eae: error: {said}") and err.count("\n") == 1, (args, err)


def test_a_relative_data_path_that_is_not_there_is_named_as_given(tmp_path, monkeypatch, capsys):
    """docs/evaluation.md's `--data tacred:train.json,...` said "--data tacred:/abs/cwd/train.json:
    not found": the check read the paths after they were made absolute for the Ray task."""
    monkeypatch.chdir(tmp_path)
    model = ["--model", "models:/eae@pretrained", "--set", f"eval.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    for args, said in (
        (["lama", "--data", "lama:data/TREx/P19.jsonl"], "--data lama:data/TREx/P19.jsonl: not found\n"),
        (["relations", "--data", "tacred:train.json,dev.json,test.json"], "--data tacred:train.json: not found\n"),
        (["lama", "--data", "geonames,synth:runs/world"], "--data synth:runs/world: not found (write a world"),
    ):
        assert cli.main(["eval", *args, *model]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"eae: error: {said}") and err.count("\n") == 1, (args, err)


def test_a_qa_run_not_in_the_store_is_named_before_anything_runs(tmp_path, capsys):
    """analysis/overlap's --runs are looked up by the command itself: nothing printed before the
    error (the task's lookup came after the Ray cluster's and the task's own lines)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert cli.main(["eval", "overlap", "--runs", "qa-eae,qa-no_eae", "--set", f"eval.mlflow_uri={uri}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("eae: error: ") and captured.err.count("\n") == 1
    assert captured.err.endswith(f"no MLflow run with id or name 'qa-eae' in {uri}\n")  # (its file named first: none there)


def test_a_tracking_store_that_is_down_is_one_line_not_a_traceback(synth_pretrained, capsys):
    """A tracking server that does not answer is asked on the driver before Ray starts
    (tracking.check_reachable): the store's message alone, exit 2, as other bad input. (Before,
    the run created inside the Ray task said it, wrapped by Ray, ~10 s later.)"""
    from tests.conftest import free_port

    tmp, _, _ = synth_pretrained
    dead = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["eval", "masked", "--model", str(tmp / "model"), "--data", str(tmp / "data"),
                     "--set", f"eval.mlflow_uri={dead}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"eae: error: cannot create an MLflow run: tracking store {dead} unreachable"), line


def test_bad_typing_and_relation_data_are_clear_errors(tmp_path):
    """The `--data KIND:ARG,...` dispatch (span_tasks.load_splits): an unknown kind or a wrong
    number of arguments names the usage; a split left empty names it and the skips."""
    import re

    for spec in ("squad:x", "synth:a", "openentity:a,b", "wiki:"):
        usage = "use synth:WORLD,DATA, wiki:DATA[,WORDNET_FILE] or openentity:DIR"
        with pytest.raises(ValueError, match=re.escape(f"typing data {spec!r}: {usage}") + "$"):
            entity_typing.load_typing(spec, 64, 10)
    for spec in ("squad:x", "synth:a,b,c", "wiki:a,b"):
        usage = "use synth:WORLD,DATA, wiki:DATA or tacred:TRAIN,DEV,TEST"
        with pytest.raises(ValueError, match=re.escape(f"relation data {spec!r}: {usage}") + "$"):
            relations.load_relations(spec, 64, 10, 0)
    with pytest.raises(ValueError, match="tacred needs TRAIN,DEV,TEST json files"):
        relations.load_relations("tacred:a", 64, 10, 0)
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps([{"relation": "per:city_of_birth", "token": ["Ada", "was", "born", "in", "London"],
                                 "subj_start": 0, "subj_end": 0, "obj_start": 4, "obj_end": 4}] * 3))
    bad.write_text(json.dumps([{"relation": "per:city_of_birth"}]))
    data, skipped = relations.load_relations(f"tacred:{good},{good},{good}", 64, 2, 0)
    assert [len(data[s]) for s in ("train", "dev", "test")] == [2, 2, 2] and not skipped  # max_examples per split
    with pytest.raises(ValueError, match=re.escape(f"relation data 'tacred:{good},{bad},{good}' has no dev example "
                                                   "(skipped: {'bad_record': 1})")):
        relations.load_relations(f"tacred:{good},{bad},{good}", 64, 10, 0)


@pytest.mark.parametrize("task", ["lama", "typing", "relations"])
def test_split_of_a_task_that_reads_no_one_split_is_refused_and_not_announced(tmp_path, task, capsys):
    """lama reads every probe, typing and relations train on train, choose on dev and report dev
    and test: `--split dev` was taken and ignored, and the task announced "(split dev)" (or
    "(split test)" without it) over numbers of no one split. Refused now, as `eae` says it,
    before anything runs; the start line names a split only for the tasks that read one."""
    from eae_platform.evaluate import describe

    world = tmp_path / "world"
    world.mkdir()
    code = cli.main(["eval", task, "--model", str(tmp_path / "model"), "--data", f"synth:{world},{tmp_path}",
                     "--split", "dev"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"eae: error: --split: eval {task} reads no one split"), err
    assert "Traceback" not in err
    config = load_eval_config(task=task, model="runs/models/eae", data=f"synth:{world}")
    assert "(split" not in describe(config), describe(config)
    for reads_one in ("masked", "topk"):
        config = load_eval_config(task=reads_one, model="m", data="runs/data", split="dev")
        assert describe(config).endswith(" (split dev)"), describe(config)
