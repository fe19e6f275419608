"""How good are the labels: gold labels, metrics, reports and temperature scaling.

Nothing here imports torch: these commands read the Parquet that `clef score` wrote.
"""
