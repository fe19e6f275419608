"""Exception types shared by every stage of the pipeline.

Two kinds of failure exist and they must never be confused: a `RecordError` belongs to one
record (it becomes that record's `error` cell and the job goes on), a `ClefError` belongs to the
job (bad option, missing model, unreadable input file) and stops it with one clear line.
"""

from __future__ import annotations


class ClefError(Exception):
    """A job-level failure shown to the user as one line, without a traceback."""


class UsageError(ClefError):
    """The command line or its files are wrong in a way the user must fix (exit code 2)."""


class ModelLoadError(ClefError):
    """The release could not be found or does not have the expected layout."""


class ModelRefused(ModelLoadError, UsageError):
    """A `--model` or `--device` the user must change before anything can run (a folder that is no
    Clef release, a GPU this machine lacks): a `ModelLoadError` to a library caller, and, like any
    `UsageError`, refused with exit 2 and nothing written."""


class JobStopped(KeyboardInterrupt):
    """A stop request honoured inside a step that does not finish (a model load, the output
    being written): the engine catches it and reports the job interrupted, everything committed
    kept. A KeyboardInterrupt, so one that escapes still exits 130 at the CLI."""


ERROR_KINDS = ("invalid", "media", "overflow", "unsupported", "transient")
"""A failed record's `error_kind` (docs/scoring.md, "Errors and their kinds"): `invalid` the record
itself (fields, schema, duplicate id), `media` a media entry unreadable, refused or over a limit,
`overflow` a prompt that does not fit --max-length or the engine's limit (vLLM's max_model_len),
`unsupported` a record the engine does not score (a modality it refuses), `transient` a failure that
may not happen again (a remote fetch, an encoding process that died, out of GPU memory even alone)."""
RETRIED_KINDS = ("overflow", "unsupported", "transient")
"""Kinds that are no verdict on the record alone (a limit, an engine, chance): never stored as a
key's final result, so the next run on the same checkpoint tries those records again (with a larger
limit or another engine they are scored; an unchanged one refuses them again at planning, before
the model is loaded)."""


class RecordError(Exception):
    """A failure that concerns one record only; it names the record and the field. `kind` is
    one of `ERROR_KINDS`, or None where the stage that catches it decides (validation: invalid,
    encoding: media). A record whose id cannot be read has `record_id` None and is named by its
    `index` (its row's id is null: `row_id`)."""

    def __init__(
        self, record_id: str | None, field: str | None, message: str, kind: str | None = None, index: int | None = None
    ) -> None:
        self.record_id = record_id
        self.field = field
        self.message = message
        self.kind = kind
        self.index = index
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"record {self.record_id!r}" if self.record_id is not None else f"record at index {self.index}"
        if self.field:
            where += f", field {self.field!r}"
        return f"{where}: {self.message}"


def error_of_copy(error: str, stored_id: str, record_id: str) -> str:
    """A stored error as another record with the same prompt shows it: the copies of one prompt
    share the result stored under the first's id, but each row's error names its own record."""
    stored = f"record {stored_id!r}"
    if stored_id != record_id and error.startswith(stored):
        return f"record {record_id!r}{error[len(stored) :]}"
    return error


UNEXPECTED = "clef could not handle this record"
"""The start of a last guard's message: a value that validation let through failed later. Tests
assert it never appears, so the guard keeps the job going without hiding a missing check."""


def unexpected_error(
    record_id: str | None, field: str | None, error: BaseException, index: int | None = None
) -> RecordError:
    """A record's error for an exception no check foresaw (so the job goes on); it says what failed.
    `index` names a record whose id was not read (`RecordError`)."""
    detail = f"{type(error).__name__}: {error}".encode("utf-8", "backslashreplace").decode("utf-8")
    if len(detail) > 300:
        detail = detail[:297] + "..."
    return RecordError(record_id, field, f"{UNEXPECTED} ({detail}); please report this", index=index)
