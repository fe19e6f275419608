"""A store in a bucket with one object damaged by hand (issue 57.1, 57.2, 57.8): each kind of
object (keys, results, hidden) deleted, one byte changed, cut short, or rewritten with valid but
other content, met by a fresh machine or a warm cache. Every cell ends in correct rows (each key's
row its own record's) or a one-line refusal naming the object, its manifest and the way on, and
the store is whole again after the next job: never a wrong row, never a store that stays broken."""

from __future__ import annotations

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.store.ledger import Ledger
from clef_cli.store.remote import manifests
from clef_cli.store.remote.compaction import compact
from clef_cli.store.remote.segments import DamagedObject

from .support.remote_stores import commit, fresh_machine, key_of, open_machine, reversed_rows

BUCKET = "clef-store-damage"
STORE = f"s3://{BUCKET}/damaged/"
NIGHTS = (range(0, 8), range(8, 16))
"""Two syncs: two segments; the first one's objects are damaged."""
ALL = range(0, 16)
runner = CliRunner()


def segment_objects(client) -> list[str]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="damaged/segments/").get("Contents", [])
    return sorted(item["Key"] for item in listed)


def make_store(client, tmp_path) -> dict[str, str]:
    """The store of two nights; the first night's objects by kind."""
    writer = open_machine(STORE, tmp_path / "writer")
    commit(writer, NIGHTS[0], per_shard=4, with_hidden=True)
    writer.sync()
    first = segment_objects(client)
    commit(writer, NIGHTS[1], per_shard=4, with_hidden=True)
    writer.sync()
    writer.close()
    others = [name for name in segment_objects(client) if name not in first]
    return {name.rsplit(".", 1)[1]: name for name in first} | {
        "other-" + name.rsplit(".", 1)[1]: name for name in others
    }


def damage(client, objects: dict[str, str], kind: str, how: str) -> None:
    key = objects[kind]
    if how == "deleted":
        client.delete_object(Bucket=BUCKET, Key=key)
        return
    data = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    if how == "byte":
        middle = len(data) // 2
        data = data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif kind == "keys":
        data = reversed_rows(data)
    else:  # another segment's object of the same kind: valid, but not this one's
        data = client.get_object(Bucket=BUCKET, Key=objects["other-" + kind])["Body"].read()
    client.put_object(Bucket=BUCKET, Key=key, Body=data)


def number_of(table: pa.Table, row: int) -> int:
    """The record a stored row belongs to, by its results (made-up: the probability is n % 100 / 100)."""
    answers = table.column("answers")[row].as_py()
    return round(answers[0]["labels"][0]["logit"])


def checked_reads(checkpoint, numbers: range, states: bool) -> set[int]:
    """The records the checkpoint holds, each read and found its own (results, and states when
    `states`); a damaged object met is a one-line refusal naming it and its manifest."""
    found = checkpoint.index.locate([key_of(n) for n in numbers])
    held = set()
    for number in numbers:
        if key_of(number) not in found:
            continue
        shard, row = found[key_of(number)]
        try:
            table = checkpoint.shard_table(shard)
            if states:
                for hidden in checkpoint.hidden_shards():
                    if hidden.path.name.startswith(shard):
                        assert hidden.verify()
        except DamagedObject as refused:
            said = str(refused)
            assert "\n" not in said and "/segments/" in said and "manifests/" in said, said
            assert "clef score" in said and "clef checkpoint repair" in said, said
            continue
        assert table.column("record_key")[row].as_py() == key_of(number)  # never a wrong row
        assert number_of(table, row) == number
        held.add(number)
    return held


def job(cache, numbers: range = ALL) -> set[int]:
    """A job needing `numbers` on a machine: keyed, its reused records' objects checked, the rows
    it reuses found its own, the rest computed and committed; what it computed."""
    writer = open_machine(STORE, cache)
    try:
        writer.begin_run()
        ledger = Ledger(writer.index, writer.run_seq)
        with writer.index.transaction() as db:
            db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", [(n, f"r{n}", key_of(n)) for n in numbers])
        writer.ledger = ledger
        writer.set_aside_damaged()
        reused = checked_reads(writer, numbers, states=False)
        computed = [n for n in numbers if n not in reused]
        commit(writer, computed, per_shard=4, with_hidden=True)
        writer.sync()
    finally:
        writer.close()
    return set(computed)


def whole(tmp_path, name: str) -> None:
    """A machine that never saw the store reads every record, results and states, each its own."""
    with fresh_machine(STORE, tmp_path / name) as reader:
        assert checked_reads(reader, ALL, states=True) == set(ALL)


KINDS = ["keys", "results", "hidden"]
HOWS = ["deleted", "byte", "truncated", "other"]


@pytest.mark.parametrize("machine", ["fresh", pytest.param("warm", marks=pytest.mark.slow)])
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_object_costs_its_records_never_a_wrong_row_nor_the_store(store_bucket, tmp_path, kind, how, machine):
    objects = make_store(store_bucket, tmp_path)
    cache = tmp_path / "machine"
    if machine == "warm":  # its cache knows both segments (keys imported, nothing read yet)
        with fresh_machine(STORE, cache) as reader:
            assert checked_reads(reader, ALL, states=False) == set(ALL)
    damage(store_bucket, objects, kind, how)
    manifests.forget()
    with fresh_machine(STORE, cache) as reader:  # a `--rehead`: reads results and states, computes nothing
        held = checked_reads(reader, ALL, states=True)
    assert set(NIGHTS[1]) <= held
    manifests.forget()
    computed = job(cache)
    assert computed <= set(NIGHTS[0])
    manifests.forget()
    job(tmp_path / "second")  # a machine that never saw it: whatever was left damaged is found now
    manifests.forget()
    whole(tmp_path, "third")
    manifests.forget()
    result = runner.invoke(app, ["checkpoint", "repair", STORE, "--dry-run"])
    assert result.exit_code == 0 and "would drop 0 dead segments" in result.output, result.output


@pytest.mark.parametrize("kind", ["keys", "results"])
def test_a_compaction_leaves_a_damaged_segment_out_and_keeps_every_other_row(store_bucket, tmp_path, kind):
    objects = make_store(store_bucket, tmp_path)
    damage(store_bucket, objects, kind, "other" if kind == "keys" else "byte")
    manifests.forget()
    chain = manifests.Chain(STORE)
    merged = compact(chain, choose=lambda latest: list(latest.segments.values()))
    assert merged is not None and len(merged.segments) == 1
    manifests.forget()
    with fresh_machine(STORE, tmp_path / "reader") as reader:
        assert checked_reads(reader, ALL, states=True) == set(NIGHTS[1])
    manifests.forget()
    assert job(tmp_path / "job") == set(NIGHTS[0])
    whole(tmp_path, "after")


def test_info_verify_names_what_is_lost_and_repair_drops_it_in_one_commit(store_bucket, tmp_path):
    objects = make_store(store_bucket, tmp_path)
    damage(store_bucket, objects, "results", "deleted")
    info = ["checkpoint", "info", STORE, "--verify", "--cache-dir", str(tmp_path / "info")]
    result = runner.invoke(app, info)
    assert result.exit_code == 1, result.output
    assert f"lost: segment {objects['keys'].rsplit('/', 1)[1][:-5]} (8 records)" in result.output
    assert objects["results"] in result.output and "has lost 8 records in 1 segment" in result.output
    manifests.forget()
    before = len(store_bucket.list_objects_v2(Bucket=BUCKET, Prefix="damaged/manifests/")["Contents"])
    result = runner.invoke(app, ["checkpoint", "repair", STORE])
    assert result.exit_code == 0 and "dropped 1 dead segment (8 records lost)" in result.output, result.output
    after = len(store_bucket.list_objects_v2(Bucket=BUCKET, Prefix="damaged/manifests/")["Contents"])
    assert after == before + 2  # the claim, then the one commit that drops it and releases the claim
    manifests.forget()
    result = runner.invoke(app, [*info[:-1], str(tmp_path / "info-2")])
    assert result.exit_code == 0, result.output
    manifests.forget()
    assert job(tmp_path / "job") == set(NIGHTS[0])
    whole(tmp_path, "after")


def test_a_prune_drops_a_dead_segment_instead_of_failing(store_bucket, tmp_path):
    objects = make_store(store_bucket, tmp_path)
    damage(store_bucket, objects, "keys", "truncated")
    manifests.forget()
    from clef_cli.store.remote.pruning import prune_bucket

    report = prune_bucket(STORE, keep_runs=1, force=True, grace_seconds=86400)
    assert report.shards_removed >= 1
    manifests.forget()
    with fresh_machine(STORE, tmp_path / "reader") as reader:
        assert checked_reads(reader, ALL, states=True) <= set(NIGHTS[1])


@pytest.mark.parametrize(
    "hostile",
    [{"results": "../../etc/passwd"}, {"results": "s3://other-bucket/x.results"}, {"hidden": ["segments/../x"]}],
)
def test_a_manifest_naming_objects_no_store_writes_is_refused_in_one_line(store_bucket, tmp_path, hostile):
    import json

    make_store(store_bucket, tmp_path)
    listed = store_bucket.list_objects_v2(Bucket=BUCKET, Prefix="damaged/manifests/")["Contents"]
    key = max(item["Key"] for item in listed)
    body = json.loads(store_bucket.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    first = next(iter(body["segments"]))
    body["segments"][first] |= hostile
    store_bucket.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(body).encode())
    manifests.forget()
    result = runner.invoke(app, ["checkpoint", "info", STORE, "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 1, result.output
    said = result.output.strip()
    assert key.split("/", 1)[1] in said and "names objects no clef store writes" in said, said
    assert "Error" not in said.split(":")[0] and "Traceback" not in said


@pytest.mark.slow  # two kinds, four runs of the tiny model each (about 20 s)
@pytest.mark.parametrize(("kind", "how"), [("keys", "other"), ("results", "deleted")])
def test_a_job_on_a_damaged_store_writes_the_clean_runs_probabilities(store_bucket, monkeypatch, tmp_path, kind, how):
    """`clef score` with the tiny model: a clean run, then the store damaged by hand, then the
    same job on a machine that never saw the store: exit 0, every row the clean run's."""
    import pyarrow.parquet as pq

    from clef_cli.locations import buckets

    from .support.helpers import TINY_MODEL, write_jsonl

    questions = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
    records = [{"id": f"r{n}", "state": f"ticket {n}: the printer is on fire", "questions": questions} for n in ALL]
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_jsonl(first, records[:8])  # the first sync's segment holds these
    write_jsonl(second, records)
    common = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--max-length", "4096", "--checkpoint", STORE]

    def score(inputs, output, machine: str):
        monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / machine))
        buckets.forget()
        manifests.forget()
        result = runner.invoke(app, ["score", str(inputs), "-o", str(output), *common])
        assert result.exit_code == 0, result.output
        rows = pq.read_table(output).to_pylist()
        return {row["id"]: row["answers"][0]["labels"] for row in rows}

    score(first, tmp_path / "a.parquet", "m1")
    first_objects = segment_objects(store_bucket)
    clean = score(second, tmp_path / "b.parquet", "m1")
    objects = {name.rsplit(".", 1)[1]: name for name in first_objects}
    others = [name for name in segment_objects(store_bucket) if name not in first_objects]
    objects |= {"other-" + name.rsplit(".", 1)[1]: name for name in others}
    damage(store_bucket, objects, kind, how)
    assert score(second, tmp_path / "c.parquet", "m2") == clean
    assert score(second, tmp_path / "d.parquet", "m3") == clean  # the store is whole again
