"""The local engine: plan windows of records, encode them in worker processes, run batches on one
model, commit each batch to the checkpoint as it finishes."""
