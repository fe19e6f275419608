"""`clef checkpoint info` and `clef checkpoint prune`: what a checkpoint (a store of results
keyed by record key) holds, and dropping what no recent run used; neither loads the model."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from clef_cli.cli.console import stdout
from clef_cli.cli.usage import ClefCommand
from clef_cli.sizes import human_size

app = typer.Typer(help="Inspect and prune checkpoints.", no_args_is_help=True, rich_markup_mode=None)


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stamp)) if stamp else "-"


def _print_runs(runs: list[dict[str, Any]]) -> None:
    for run in runs:
        counts = json.loads(run["counts"]) if run["counts"] else {}
        done = ", ".join(f"{name} {value}" for name, value in counts.items()) or "not finished"
        stdout.print(
            f"run {run['run_id']}: started {_when(run['started'])} UTC, {done}; "
            f"last user of {run['keys_last_used']} keys"
        )


@app.command("info", cls=ClefCommand)
def checkpoint_info(
    directory: Annotated[Path, typer.Argument(help="A checkpoint folder (OUTPUT.parquet.ckpt).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a checkpoint: its scoring fingerprint, keys, size, and the runs that used it.

    \b
    Examples:
      clef checkpoint info out.parquet.ckpt
      clef checkpoint info out.parquet.ckpt --json
    """
    from clef_cli.store.checkpoint import Checkpoint

    checkpoint = Checkpoint.open_existing(directory)
    try:
        info = checkpoint.info()
    finally:
        checkpoint.close()
    if as_json:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return
    stdout.print(f"checkpoint: {info['path']}")
    stdout.print(
        f"keys: {info['keys']} in {info['shards']} shards ({info['shards_with_hidden_states']} with hidden states)"
    )
    stdout.print(
        f"size on disk: {human_size(info['size_bytes'])} (results {human_size(info['results_bytes'])}, "
        f"hidden states {human_size(info['hidden_bytes'])})"
    )
    stdout.print(f"model: {info['model'].get('id')}")
    for key, value in sorted(info["model"].items()):
        if key != "id":
            stdout.print(f"  {key}: {value}")
    for key, value in sorted(info["settings"].items()):
        stdout.print(f"{key}: {json.dumps(value)}")
    _print_runs(info["runs"])


@app.command("prune", cls=ClefCommand)
def checkpoint_prune(
    directory: Annotated[Path, typer.Argument(help="A checkpoint folder (OUTPUT.parquet.ckpt).")],
    keep_runs: Annotated[
        int | None, typer.Option("--keep-runs", min=0, help="Keep the keys the last N runs used.")
    ] = None,
    older_than: Annotated[
        float | None, typer.Option("--older-than", min=0, help="Drop the keys no run of the last DAYS used.")
    ] = None,
) -> None:
    """Drop the keys (results and hidden states) that no recent run used; crash-safe.

    \b
    Examples:
      clef checkpoint prune out.parquet.ckpt --keep-runs 7
      clef checkpoint prune out.parquet.ckpt --older-than 30
    """
    from clef_cli.store.prune import prune

    report = prune(directory, keep_runs, older_than)
    stdout.print(
        f"dropped {report.keys_dropped} keys ({report.rows_dropped} rows) from {report.shards_rewritten} "
        f"rewritten and {report.shards_removed} removed shards; freed {human_size(max(0, report.bytes_freed))}; "
        f"kept the keys of {len(report.kept_runs)} runs"
    )
