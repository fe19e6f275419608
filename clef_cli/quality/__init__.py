"""How good are the labels, and how to make them better: one folder per concern.

The rooms, lowest first; a module imports only from its own room, the shared modules here, or a
room listed before its own (tests/test_architecture.py checks it):

- `labels/`: labels in and out: gold files and tool exports, CSV cells a spreadsheet opens as
  text, the scored Parquet reader, the inputs eval and calibrate read, the stored states of gold
  records;
- shared here: `metrics` (the numbers every command reports), `text_table` (tables for a
  terminal, a pipe or a file), `figures` (the HTML reports' plots);
- `calibrate/`: temperature scaling (fit, apply, save);
- `evaluate/`: `clef eval`: metrics per question and group, its tables and HTML report;
- `train/`: `clef train-head`: fitting a head, the probe, cross-fitting, the held-out gate;
- `review/`: `clef review`: which records people should label, in their tool's format;
- `compare/`: `clef compare`: drift between two scored files.

Only `train/` imports torch; the other commands read the Parquet that `clef score` wrote.
"""
