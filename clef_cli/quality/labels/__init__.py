"""Labels in and out: gold files, tool exports, scored outputs, and the stored states of gold records."""
