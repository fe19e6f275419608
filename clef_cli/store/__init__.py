"""The product's memory: the checkpoint (journal and result shards), the hidden-state shards
(one writer, one streaming reader), job locks and the atomic writer. Torch-free, so
`clef checkpoint info` stays light."""
