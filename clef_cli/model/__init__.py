"""The model: the family's backbone (the thinker), the joint schema head, the answer rules, and the
scorer that runs one batch through both. Importing this package imports nothing heavy; its
modules do."""
