"""`clef checkpoint info` and `clef checkpoint prune`: what a checkpoint (a store of results
keyed by record key) holds, and dropping what no recent run used; neither loads the model."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from clef_cli.cli.console import stdout
from clef_cli.cli.examples import epilog
from clef_cli.cli.options import local_location, read_location
from clef_cli.cli.usage import ClefCommand
from clef_cli.errors import ClefError
from clef_cli.sizes import human_size, plural

if TYPE_CHECKING:
    from clef_cli.store.prune import PruneReport
    from clef_cli.store.remote.cache_prune import CachePruned

app = typer.Typer(help="Inspect and prune checkpoints.", no_args_is_help=True, rich_markup_mode=None)


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stamp)) if stamp else "-"


RUN_COUNT_WORDS = {
    "run": "to compute",
    "forwarded": "through the model",
    "reused": "reused",
    "duplicates": "duplicates",
    "retried": "retried",
    "invalid": "invalid",
    "committed": "committed",
}
"""A run's counts (docs/scoring.md, "Counts") as words after the number: `run 20` read like a run id."""


def _counts(run: dict[str, Any]) -> str:
    """The run's counts in words. A finished run computed every record it had to (`run`), and
    `forwarded` of them reached the model: one number, the other only when some failed on the way;
    an interrupted run's `run` is what it set out to compute, so both are said."""
    counts = dict(run["counts"] or {})
    if run["finished"] is None or "run" not in counts:
        return ", ".join(f"{value:,} {RUN_COUNT_WORDS.get(name, name)}" for name, value in counts.items())
    computed, forwarded = counts.pop("run"), counts.pop("forwarded", None)
    said = f"{computed:,} computed"
    if forwarded is not None and forwarded != computed:
        said += f" ({forwarded:,} through the model, {computed - forwarded:,} failed on the way)"
    return ", ".join([said, *(f"{value:,} {RUN_COUNT_WORDS.get(name, name)}" for name, value in counts.items())])


def _print_runs(runs: list[dict[str, Any]]) -> None:
    for run in runs:
        if run["finished"] is not None:
            done = f"finished {_when(run['finished'])} UTC ({_counts(run)})"
        elif run.get("interrupted") is not None:
            said = [_counts(run), "rerun the same command to continue"]
            done = f"interrupted {_when(run['interrupted'])} UTC ({'; '.join(filter(None, said))})"
        else:
            done = "not finished (failed, killed, stopped at once or still running; the next run takes over)"
        if not run["counted"]:
            done += "; not counted by prune --keep-runs"
        stdout.print(
            f"run {run['run_id']}: started {_when(run['started'])} UTC, {done}; "
            f"last user of {plural(run['keys_last_used'], 'key')}",
            markup=False,
        )
        if run["inputs"]:
            stdout.print(f"  inputs: {', '.join(run['inputs'])}", markup=False)
        if run["output"]:
            stdout.print(f"  output: {run['output']}", markup=False)


def _plain(value: Any) -> str:
    """A setting as text: strings without JSON quotes, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


StoreArgument = Annotated[
    str,
    typer.Argument(
        callback=read_location,
        help="A checkpoint folder (OUTPUT.parquet.ckpt) or a store in a bucket (s3://bucket/store/).",
    ),
]
CacheDirOption = Annotated[
    str | None,
    typer.Option(
        "--cache-dir",
        callback=local_location,
        metavar="DIR",
        help="A store in a bucket: where its local cache folders live (as clef score's).",
    ),
]


CheckpointInfoAsJsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
CheckpointInfoVerifyOption = Annotated[
    bool,
    typer.Option(
        "--verify",
        help="A store in a bucket: check that every object its manifest names is there at its size (a HEAD "
        "request an object) and say which records a damaged store has lost (exit 1 when some are).",
    ),
]


@app.command("info", cls=ClefCommand, epilog=epilog("checkpoint info"))
def checkpoint_info(
    directory: StoreArgument,
    as_json: CheckpointInfoAsJsonOption = False,
    cache_dir: CacheDirOption = None,
    verify: CheckpointInfoVerifyOption = False,
) -> None:
    """Show a checkpoint: its scoring fingerprint, keys, size, and the runs that used it."""
    from clef_cli.store.location import store_location
    from clef_cli.store.opening import open_existing_store, verify_store

    location = store_location(directory, cache_dir, "DIRECTORY")
    checkpoint = open_existing_store(location, locked=False)
    try:
        info = checkpoint.info()
        if verify:
            info["lost"] = verify_store(checkpoint)
    finally:
        checkpoint.close()
    _print_info(info, as_json)
    if info.get("lost"):
        records = sum(item["records"] for item in info["lost"])
        raise ClefError(
            f"the store {location.uri or location.folder} has lost {plural(records, 'record')} in "
            f"{plural(len(info['lost']), 'segment')}: `clef checkpoint repair` drops them from its manifest and the "
            "next `clef score` that needs them computes them again"
        )


def _print_info(info: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return
    stdout.print(f"checkpoint: {info['path']}", markup=False)
    if "segments" in info:
        stdout.print(
            f"in the bucket: {plural(info['segments'], 'segment')}, manifest {info['manifest']}; cache {info['cache']}",
            markup=False,
        )
    where = "in the bucket" if "segments" in info else "on disk"
    stdout.print(
        f"keys: {info['keys']:,} in {plural(info['shards'], 'shard')} "
        f"({plural(info['shards_with_hidden_states'], 'shard')} with hidden states, "
        f"{plural(info['keys_with_hidden_states'], 'key')} with their states)"
    )
    stdout.print(
        f"size {where}: {human_size(info['size_bytes'])} (results {human_size(info['results_bytes'])}, "
        f"hidden states {human_size(info['hidden_bytes'])})"
    )
    if info["damaged_shards"]:
        stdout.print(
            f"damaged: {plural(len(info['damaged_shards']), 'shard')} whose check fails "
            f"({plural(info['damaged_records'], 'record')}: {', '.join(info['damaged_shards'])}); the next "
            "`clef score` on this store drops them and computes their records again",
            markup=False,
        )
    stdout.print(f"model: {info['model'].get('id')}", markup=False)
    for key, value in sorted(info["model"].items()):
        if key != "id":
            stdout.print(f"  {key}: {_plain(value)}", markup=False)
    for key, value in sorted(info["settings"].items()):
        stdout.print(f"{key}: {_plain(value)}", markup=False)
    _print_runs(info["runs"])
    for item in info.get("lost") or ():
        stdout.print(
            f"lost: segment {item['segment']} ({plural(item['records'], 'record')}): {item['why']}", markup=False
        )


CheckpointRepairDryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Say which segments are dead; change nothing.")
]


@app.command("repair", cls=ClefCommand, epilog=epilog("checkpoint repair"))
def checkpoint_repair(
    directory: StoreArgument,
    dry_run: CheckpointRepairDryRunOption = False,
) -> None:
    """A store in a bucket: drop the segments whose objects are missing or damaged, in one commit.

    Each segment's keys and results objects are downloaded and checked against their names (the
    store's keys and results bytes, no hidden states), its hidden-state objects by their sizes;
    the dead ones leave the manifest in one commit under the store's claim (as a prune's). Their
    records are computed again by the next `clef score` that needs them. A folder store is opened
    as a job opens it (every file checked): its damaged shards are dropped.
    """
    from clef_cli.store.location import store_location
    from clef_cli.store.opening import repair_store

    lost, checked = repair_store(store_location(directory, None, option="DIRECTORY"), dry_run)
    verb = "would drop" if dry_run else "dropped"
    records = sum(item.records for item in lost)
    stdout.print(
        f"checked {plural(checked, 'segment')}: {verb} {plural(len(lost), 'dead segment')} "
        f"({plural(records, 'record')} lost)",
        markup=False,
    )
    for item in lost:
        stdout.print(f"  {item.segment} ({plural(item.records, 'record')}): {item.why}", markup=False)


CheckpointPruneKeepRunsOption = Annotated[
    int | None,
    typer.Option(
        "--keep-runs",
        help="Keep the keys the last N completed runs used (runs where every record was invalid, and "
        "interrupted runs, do not count; what a later run touched is kept too). At least 1.",
    ),
]
CheckpointPruneOlderThanOption = Annotated[
    float | None,
    typer.Option("--older-than", help="Drop the keys no run started in the last DAYS used. Above 0."),
]
CheckpointPruneDryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Say what would go (keys, rows, shards, bytes); change nothing.")
]
CheckpointPruneForceOption = Annotated[
    bool, typer.Option("--force", help="Allow a prune that drops every key (refused without it).")
]
CheckpointPruneGraceHoursOption = Annotated[
    float,
    typer.Option(
        "--grace-hours",
        min=0.0,
        help="A store in a bucket: delete objects no manifest names (what the prune replaced, uploads of "
        "killed writers) once older than this.",
    ),
]
CheckpointPruneNoRunningJobsOption = Annotated[
    bool,
    typer.Option(
        "--no-running-jobs",
        help="A store in a bucket: no job writes to it while this prune runs (an offline store), so "
        "--grace-hours may be under its floor (a claim's lease plus a commit's patience, 0.42 h by default).",
    ),
]


@app.command("prune", cls=ClefCommand, epilog=epilog("checkpoint prune"))
def checkpoint_prune(
    directory: StoreArgument,
    keep_runs: CheckpointPruneKeepRunsOption = None,
    older_than: CheckpointPruneOlderThanOption = None,
    dry_run: CheckpointPruneDryRunOption = False,
    force: CheckpointPruneForceOption = False,
    grace_hours: CheckpointPruneGraceHoursOption = 24.0,
    cache_dir: CacheDirOption = None,
    no_running_jobs: CheckpointPruneNoRunningJobsOption = False,
) -> None:
    """Drop the keys (results and hidden states) that no recent run used; crash-safe.

    Given both options, a key is kept only when both keep it: used by one of the last N
    completed runs (or a run since) and by a run started in the last DAYS. A prune that would
    drop every key is refused (exit 2) unless --force. A store in a bucket: this machine's cache
    folders of it (under --cache-dir) are pruned to match, and their staged outputs removed.
    """
    from clef_cli.store.location import store_location
    from clef_cli.store.opening import prune_store

    location = store_location(directory, cache_dir, option="DIRECTORY")
    report = prune_store(location, keep_runs, older_than, force, dry_run, grace_hours, cache_dir, no_running_jobs)
    stdout.print(prune_summary(report), markup=False)
    if location.remote:
        verb = "would delete" if report.dry_run else "deleted"
        stdout.print(f"{verb} {plural(report.objects_deleted, 'object')} no manifest names", markup=False)
    if report.cache is not None:
        stdout.print(cache_summary(report.cache), markup=False)
    if report.dry_run and report.drops_every_key:
        then = "--force drops them all" if force else "this prune is refused unless --force"
        stdout.print(f"that is every key: without --dry-run, {then}", markup=False)


CheckpointUnclaimConfirmOption = Annotated[
    bool, typer.Option("--confirm", help="Break the claim (refused without it, naming whose it is).")
]


@app.command("unclaim", cls=ClefCommand, epilog=epilog("checkpoint unclaim"))
def checkpoint_unclaim(
    directory: StoreArgument,
    confirm: CheckpointUnclaimConfirmOption = False,
) -> None:
    """A store in a bucket: break the claim a prune or a compaction left on it, and say whose it was.

    A claim ends by itself a lease (CLEF_CLAIM_LEASE_SECONDS, 15 minutes) after it was taken, by
    the bucket's clock; this is for one whose holder is gone. A holder that still runs commits
    nothing once its claim is broken (its work is lost, never the store's). A folder store has no
    claim: its jobs hold its lock.
    """
    from clef_cli.store.location import store_location
    from clef_cli.store.opening import unclaim_store
    from clef_cli.store.remote.claims import claim_said

    location = store_location(directory, None, option="DIRECTORY")
    if not location.remote:
        said = f"{location.folder} is a folder store: it has no claim (a running job holds its lock)"
        stdout.print(said, markup=False)
        return
    claim = unclaim_store(location, confirm)
    where = location.uri or directory
    said = f"broke {claim_said(claim, where)}" if claim is not None else f"no claim on {where}: nothing to break"
    stdout.print(said, markup=False)


def prune_summary(report: PruneReport) -> str:
    """What a prune dropped, or would drop: the line cron logs keep."""
    verb, freed, kept = (
        ("would drop", "would free about", "would keep") if report.dry_run else ("dropped", "freed", "kept")
    )
    shards = plural(report.shards_removed + report.shards_rewritten, "shard")
    return (
        f"{verb} {report.keys_dropped:,} of {plural(report.keys_before, 'key')} ({plural(report.rows_dropped, 'row')}) "
        f"in {shards} ({report.shards_removed:,} removed whole, {report.shards_rewritten:,} rewritten); {freed} "
        f"{human_size(max(0, report.bytes_freed))}; {kept} the keys of {plural(len(report.kept_runs), 'completed run')}"
    )


def cache_summary(pruned: CachePruned) -> str:
    """What pruning this machine's cache of a bucket store did, or would do."""
    staged = plural(pruned.staged, "staged output")
    if pruned.dry_run:
        said = f"this machine's cache ({pruned.root}): would remove {staged} ({human_size(pruned.bytes_freed)})"
        said += f"; {plural(pruned.folders, 'cache folder')} follow the store when pruned"
    else:
        said = f"this machine's cache ({pruned.root}): {plural(pruned.folders, 'cache folder')} pruned to match"
        said += f", {staged} removed; freed {human_size(pruned.bytes_freed)}"
    if pruned.held:
        said += f"; left {plural(len(pruned.held), 'folder')} a running job holds"
    return said
