"""`clef score`'s options that say where its store lives: a folder, or a bucket's prefix with
its local cache, how often it is synced, and the confirmation a shared store's restart needs."""

from __future__ import annotations

from typing import Annotated

import typer

from clef_cli.cli.options import DIR_OR_URI, PANEL_STORE, local_location, read_location

CheckpointOption = Annotated[
    str | None,  # as given: a Path would fold `s3://b/ck` into the local `s3:/b/ck` (settings refuses a URI)
    typer.Option(
        "--checkpoint",
        callback=read_location,
        metavar=DIR_OR_URI,
        rich_help_panel=PANEL_STORE,
        help="Checkpoint folder, a store of results by prompt any run may share (default: OUTPUT.ckpt); or a "
        "bucket's prefix (s3://bucket/store/: a store machines share, kept in a local cache folder).",
    ),
]
CacheDirOption = Annotated[
    str | None,
    typer.Option(
        "--cache-dir",
        callback=local_location,
        metavar="DIR",
        rich_help_panel=PANEL_STORE,
        help="With --checkpoint s3://...: where the store's local cache folders live (default $CLEF_CACHE_DIR, "
        "else $XDG_CACHE_HOME/clef, else ~/.cache/clef). Losing it costs only downloads.",
    ),
]
SyncEveryOption = Annotated[
    float,
    typer.Option(
        "--sync-every",
        rich_help_panel=PANEL_STORE,
        help="With --checkpoint s3://...: seconds between two commits to the bucket (beside the scoring); a "
        "killed machine loses at most that much work.",
    ),
]
SyncFailureLimitOption = Annotated[
    float,
    typer.Option(
        "--sync-failure-limit",
        metavar="SECONDS",
        rich_help_panel=PANEL_STORE,
        help="With --checkpoint s3://...: once the syncs have kept failing this long, the job stops (exit 1), "
        "keeping its work in this machine's cache for a rerun here to upload.",
    ),
]
ConfirmRestartOption = Annotated[
    bool,
    typer.Option(
        "--confirm-restart",
        rich_help_panel=PANEL_STORE,
        help="With --restart on a store in a bucket: yes, discard what every machine using it shares.",
    ),
]
KeepStagedOutputOption = Annotated[
    bool,
    typer.Option(
        "--keep-staged-output",
        rich_help_panel=PANEL_STORE,
        help="With -o s3://...: keep the output's local copy (in the checkpoint's upload/ folder) after its "
        "upload; by default it is removed once uploaded.",
    ),
]
ReheadOption = Annotated[
    str | None,
    typer.Option(
        "--rehead",
        callback=local_location,
        metavar="DIR",
        rich_help_panel=PANEL_STORE,
        help="Re-score the checkpoint's hidden states with the joint head in this folder (not with --ray or "
        "--hidden-states); the thinker runs only on the records whose states the store lacks.",
    ),
]
