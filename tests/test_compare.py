"""`clef compare`: flips and distributions against a direct loop over both Parquet files, PSI and
JS against scipy, the join on `record_key`, and the exit code for cron."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import require_program
from .support.scored_files import SCHEMA, random_probabilities, random_records, write_scored

runner = CliRunner()


def runs(tmp_path, keyed: bool = False, layout: str = "wide"):
    """Old: 70 records; new: the first 60 of them (every third rescored) plus 10 new ones."""
    old = random_records(seed=5, n=70)
    rng = np.random.default_rng(9)
    new = []
    for number, (record_id, answers) in enumerate(old[:60]):
        if answers is not None and number % 3 == 0:
            answers = {q: random_probabilities(rng, len(SCHEMA[q][1])) for q in answers}
        new.append((record_id, answers))
    new += random_records(seed=6, n=10, prefix="n")
    extra_old = extra_new = None
    if keyed:  # other ids in the new run, the same record_key
        extra_old = {"record_key": [f"k-{rid}" for rid, _ in old]}
        extra_new = {"record_key": [f"k-{rid}" for rid, _ in new]}
        new = [(f"new-{rid}", answers) for rid, answers in new]
    return (
        write_scored(tmp_path / "old.parquet", old, layout=layout, extra=extra_old),
        write_scored(tmp_path / "new.parquet", new, layout=layout, extra=extra_new),
    )


def answers_of(path, key: str) -> dict[str, dict[str, tuple[str, float]]]:
    found: dict[str, dict[str, tuple[str, float]]] = {}
    for row in pq.read_table(path).to_pylist():
        for answer in row["answers"] or ():
            found.setdefault(row[key], {})[answer["question_id"]] = (answer["answer"], answer["confidence"])
    return found


def direct(old_path, new_path, key: str) -> dict:
    old, new = answers_of(old_path, key), answers_of(new_path, key)
    result = {"shared": len(set(old) & set(new)), "questions": {}}
    for qid, (_, options) in SCHEMA.items():
        both = [k for k in old if k in new and qid in old[k] and qid in new[k]]
        flips = sorted(k for k in both if old[k][qid][0] != new[k][qid][0])
        counts = [[sum(run[k][qid][0] == o for k in both) for o in options] for run in (old, new)]
        only_old = [sum(old[k][qid][0] == o for k in old if qid in old[k] and k not in both) for o in options]
        mean = [float(np.mean([run[k][qid][1] for k in both])) for run in (old, new)]
        result["questions"][qid] = {"flips": flips, "counts": counts, "only_old": only_old, "mean": mean}
    return result


def readme_psi(old: list[int], new: list[int]) -> float:
    """docs/human-loop.md's definition in a plain loop: Σ (q − p) ln(q / p) over shares smoothed as
    (count + 0.5) / (n + 0.5 K)."""
    total = 0.0
    for old_count, new_count in zip(old, new, strict=True):
        p = (old_count + 0.5) / (sum(old) + 0.5 * len(old))
        q = (new_count + 0.5) / (sum(new) + 0.5 * len(new))
        total += (q - p) * math.log(q / p)
    return total


@pytest.mark.parametrize("keyed", [False, True])
def test_compare_against_a_direct_loop_and_scipy(tmp_path, keyed):
    old, new = runs(tmp_path, keyed)
    out = tmp_path / "drift.json"
    result = runner.invoke(app, ["compare", str(old), str(new), "--json", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    key = "record_key" if keyed else "id"
    expected = direct(old, new, key)
    assert document["join"] == key and document["shared_records"] == expected["shared"]
    assert document["only_new_records"] == 9  # ten new records, one of them failed
    flipped_total = 0
    for qid, (_, options) in SCHEMA.items():
        found, want = document["questions"][qid], expected["questions"][qid]
        flips = sorted(f[key] for f in document["flips"] if f["question_id"] == qid)
        assert flips == want["flips"] and found["flipped"] == len(want["flips"]) > 0
        flipped_total += found["flipped"]
        assert [found["old"]["counts"][o] for o in options] == want["counts"][0]
        assert [found["new"]["counts"][o] for o in options] == want["counts"][1]
        assert [found["only_old"]["counts"][o] for o in options] == want["only_old"]
        assert found["old"]["mean_confidence"] == pytest.approx(want["mean"][0], abs=1e-12)
        assert found["new"]["mean_confidence"] == pytest.approx(want["mean"][1], abs=1e-12)
        assert found["psi"] == pytest.approx(readme_psi(*want["counts"]), abs=1e-12)
        p, q = (np.array(c, float) for c in want["counts"])
        smooth_p, smooth_q = (p + 0.5) / (p.sum() + 0.5 * len(p)), (q + 0.5) / (q.sum() + 0.5 * len(q))
        assert found["psi"] == pytest.approx(entropy(smooth_q, smooth_p) + entropy(smooth_p, smooth_q), abs=1e-12)
        assert found["js"] == pytest.approx(jensenshannon(p / p.sum(), q / q.sum(), base=2) ** 2, abs=1e-12)
    assert len(document["flips"]) == flipped_total
    if keyed:
        assert all(f["id"].startswith("new-") for f in document["flips"])


def test_long_layout_gives_the_same_numbers(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "l").mkdir()
    wide = runs(tmp_path / "w")
    long = runs(tmp_path / "l", layout="long")
    documents = []
    for old, new in (wide, long):
        out = old.parent / "d.json"
        assert runner.invoke(app, ["compare", str(old), str(new), "--json", str(out)]).exit_code == 0
        documents.append(json.loads(out.read_text()))
    for document in documents:
        del document["old"], document["new"]
    assert documents[0] == documents[1]


def test_fail_above_psi_and_the_table(tmp_path):
    old, new = runs(tmp_path)
    out = tmp_path / "d.json"
    result = runner.invoke(app, ["compare", str(old), str(new), "--json", str(out)])
    top = max(q["psi"] for q in json.loads(out.read_text())["questions"].values())
    assert "team" in result.stdout and "PSI" in result.stdout
    failing = runner.invoke(app, ["compare", str(old), str(new), "--fail-above-psi", str(top * 0.5)])
    assert failing.exit_code == 5 and "PSI above" in failing.stderr
    passing = runner.invoke(app, ["compare", str(old), str(new), "--fail-above-psi", str(top * 2)])
    assert passing.exit_code == 0, passing.output
    same = runner.invoke(app, ["compare", str(old), str(old), "--fail-above-psi", "0"])
    assert same.exit_code == 0, same.output


def test_report_and_its_rendering_in_headless_chromium(tmp_path):
    old, new = runs(tmp_path)
    report, shot = tmp_path / "r.html", tmp_path / "shot.png"
    assert runner.invoke(app, ["compare", str(old), str(new), "--report", str(report)]).exit_code == 0
    text = report.read_text()
    assert text.count("<img") == 3 * len(SCHEMA) and "data:image/png;base64," in text
    for qid in SCHEMA:
        assert f"id='q-{qid}'" in text
    chromium = require_program("chromium")  # skips where missing, fails under CI=true
    import subprocess

    from PIL import Image

    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}"]
    subprocess.run([*command, "--window-size=1100,900", report.as_uri()], capture_output=True, timeout=120)
    image = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert image.shape == (900, 1100) and image.std() > 10


TEAM = {"billing": (0.8, 0.1, 0.1), "sales": (0.1, 0.8, 0.1)}


def test_psi_and_js_of_a_hand_computed_case(tmp_path):
    """team: old billing ×3, sales ×1; new billing ×1, sales ×3 (tech never). By hand, K = 3, n = 4:
    p = (3.5, 1.5, 0.5) / 5.5, q = (1.5, 3.5, 0.5) / 5.5, PSI = (4 / 5.5) ln(7 / 3) = 0.61621662573...;
    JS = 0.75 log2(1.5) − 0.25 = 0.18872187554... (both halves equal)."""
    old = [(f"r{i}", {"team": TEAM[a]}) for i, a in enumerate(["billing", "billing", "billing", "sales"])]
    new = [(f"r{i}", {"team": TEAM[a]}) for i, a in enumerate(["billing", "sales", "sales", "sales"])]
    out = tmp_path / "d.json"
    result = runner.invoke(app, ["compare", str(write_scored(tmp_path / "o.parquet", old)),
                                 str(write_scored(tmp_path / "n.parquet", new)), "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    team = json.loads(out.read_text())["questions"]["team"]
    assert team["psi"] == pytest.approx(0.6162166257361481, abs=1e-12)
    assert team["js"] == pytest.approx(0.1887218755408671, abs=1e-12)
    assert team["flipped"] == 2 and team["old"]["counts"] == {"billing": 3, "sales": 1, "tech": 0}


def with_copies(path, extra_ids: dict[str, list[str]]):
    """The file at `path` plus, for each record id in `extra_ids`, copies of its row under the
    given ids (the same record_key and answers: what `clef score` writes for a copied prompt)."""
    rows = pq.read_table(path).to_pylist()
    records = [(row["id"], {a["question_id"]: tuple(o["probability"] for o in a["labels"]) for a in row["answers"]}
                if row["answers"] else None) for row in rows]  # fmt: skip
    keys = [row["record_key"] for row in rows]
    for row in list(rows):
        for copy in extra_ids.get(row["id"], []):
            records.append((copy, records[rows.index(row)][1]))
            keys.append(row["record_key"])
    return write_scored(path, records, extra={"record_key": keys})


def test_copies_of_a_prompt_count_once(tmp_path):
    """Defect: a table with copies (one record_key under several ids, as `clef score` writes them)
    was refused. Now a key counts once: the numbers equal those of the files without copies."""
    plain = tmp_path / "plain"
    plain.mkdir()
    reference = json.loads(runner.invoke(app, ["compare", *map(str, runs(plain, keyed=True)), "--json", "-"]).stdout)
    old, new = runs(tmp_path, keyed=True)
    with_copies(old, {"r000": ["c1", "c2"], "r004": ["c3"], "r065": ["c4"]})  # r065: only in old
    with_copies(new, {"new-r000": ["d1"], "new-r010": ["d2", "d3"], "new-n001": ["d4"]})  # n001: only in new
    out = tmp_path / "d.json"
    result = runner.invoke(app, ["compare", str(old), str(new), "--json", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["old"]["copies"] == 4 and document["new"]["copies"] == 4
    for found in (document, reference):
        for run in ("old", "new"):
            del found[run]
    assert document == reference


def test_runs_that_share_no_record_warn_and_fail_the_drift_check(tmp_path):
    old = write_scored(tmp_path / "o.parquet", random_records(seed=1, n=12, prefix="a"))
    new = write_scored(tmp_path / "n.parquet", random_records(seed=2, n=12, prefix="b"))
    result = runner.invoke(app, ["compare", str(old), str(new)])
    assert result.exit_code == 0 and "warning: the two runs share no scored record (joined on id" in result.stderr
    result = runner.invoke(app, ["compare", str(old), str(new), "--fail-above-psi", "0"])
    assert result.exit_code == 5 and "no shared record, so the drift check cannot pass" in result.stderr


def test_the_tables_are_plain_text_in_a_pipe(tmp_path):
    """Off a terminal the tables are eval's plain aligned text: no box drawing, nothing cut."""
    old, new = runs(tmp_path)
    result = runner.invoke(app, ["compare", str(old), str(new)], env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["question", "n", "flipped", "PSI", "JS", "mean", "conf.", "old", "→", "new"]
    assert set(lines[2]) == {"-", " "} and not set("─━│┃╇") & set(result.stdout)
    assert any(line.split()[:2] == ["team", "tech"] for line in lines)


def test_a_missing_file_is_not_found(tmp_path):
    """Either side missing: exit 2 saying so, not pyarrow's "could not be read as Parquet"."""
    present = write_scored(tmp_path / "o.parquet", random_records(seed=1, n=3))
    missing = tmp_path / "yesterday.parquet"
    for args in ([missing, present], [present, missing]):
        result = runner.invoke(app, ["compare", *map(str, args)])
        assert result.exit_code == 2, result.output
        assert result.stderr == f"error: scored file {str(missing)!r} not found\n"
