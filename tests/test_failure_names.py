"""locations/failures.py's `named`: an error met on a URI clef made (a manifest, a probe) renamed
by the option and the URI the user gave, its cause, words and server's answer kept, so a caller
(upload_whole's rerun hint, the store's probe) can rename it again."""

from __future__ import annotations

from clef_cli.locations.failures import DENIED, NO_BUCKET, NoSuchBucket, ObjectStoreError, named, words_of
from clef_cli.locations.uploads import ConditionIgnored

GIVEN = "s3://night/out/o.parquet"
OTHER = "the object store refused the request (run `clef -v ...` for its answer)"


def test_an_error_of_its_own_words_keeps_them_and_its_kind():
    """No cause and no server's answer (the store's probe's `ConditionIgnored`): its own words."""
    error = ConditionIgnored("the bucket ignores conditional writes")
    found = named(error, "--checkpoint", GIVEN)
    assert type(found) is ConditionIgnored
    assert str(found) == f"--checkpoint {GIVEN}: the bucket ignores conditional writes"
    assert (found.failure, found.words, found.detail) == ("other", "the bucket ignores conditional writes", "")


def test_a_cause_without_an_answer_is_the_causes_words():
    error = ObjectStoreError("s3://night/m/1.json: access denied", failure=DENIED, words="access denied")
    found = named(error, "-o", GIVEN)
    assert str(found) == f"-o {GIVEN}: {words_of(DENIED, 'night')}"
    assert (found.failure, found.words, found.detail) == (DENIED, words_of(DENIED, "night"), "")


def test_an_unsorted_refusal_with_the_servers_answer_says_to_look_at_it():
    error = ObjectStoreError("s3://night/probe: odd", detail="<Code>Odd</Code>", failure="other", words="odd")
    found = named(error, "-o", GIVEN)
    assert str(found) == f"-o {GIVEN}: {OTHER}"
    assert (found.failure, found.words, found.detail) == ("other", OTHER, "<Code>Odd</Code>")


def test_a_missing_bucket_stays_a_usage_error():
    error = ObjectStoreError("x", detail="<Code>NoSuchBucket</Code>", failure=NO_BUCKET)
    found = named(error, "input", "s3://gone/in.jsonl")
    assert isinstance(found, NoSuchBucket)
    assert str(found) == f"input s3://gone/in.jsonl: {words_of(NO_BUCKET, 'gone')}"
