"""Encoding: a record becomes model inputs. Media are decoded under limits, the prompt is laid out
token by token as the reference does, question spans are located, and records are planned into
length-sorted batches and collated."""
