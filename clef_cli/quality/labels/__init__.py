"""Labels in and out: gold files, tool exports, spreadsheet CSV, scored outputs, and the stored states of gold
records."""
