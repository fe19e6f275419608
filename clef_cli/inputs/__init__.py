"""Inputs: where records come from (paths, URIs), how files become rows (JSONL, JSON, Parquet and
its struct-null rule), and what makes a row a valid record. Nothing here imports torch."""
