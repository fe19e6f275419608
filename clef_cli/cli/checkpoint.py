"""`clef checkpoint info`: what a job's checkpoint holds, without loading the model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from clef_cli.cli.console import stdout
from clef_cli.cli.usage import ClefCommand
from clef_cli.sizes import human_size

app = typer.Typer(help="Inspect job checkpoints.", no_args_is_help=True, rich_markup_mode=None)


@app.command("info", cls=ClefCommand)
def checkpoint_info(
    directory: Annotated[Path, typer.Argument(help="A checkpoint folder (OUTPUT.parquet.ckpt).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a checkpoint: records done, size on disk, the model and the settings it was made with.

    \b
    Examples:
      clef checkpoint info out.parquet.ckpt
      clef checkpoint info out.parquet.ckpt --json
    """
    from clef_cli.store.checkpoint import Checkpoint

    info = Checkpoint.open_existing(directory).info()
    if as_json:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return
    stdout.print(f"checkpoint: {info['path']}")
    stdout.print(
        f"records done: {info['records_done']} in {info['shards']} shards "
        f"({info['shards_with_hidden_states']} with hidden states)"
    )
    stdout.print(f"size on disk: {human_size(info['size_bytes'])}")
    stdout.print(f"model: {info['model'].get('id')}")
    for key, value in sorted(info["settings"].items()):
        stdout.print(f"{key}: {json.dumps(value)}")
    for item in info["inputs"]:
        stdout.print(f"input: {item['path']} ({item['bytes']} bytes)")
