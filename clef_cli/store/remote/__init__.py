"""A store in a bucket: the local store (a cache folder: journal, shards, key index) plus a sync.

`layout` names the objects and the cache folder; `segments` packs committed shards into
content-named segments and reads them back; `manifests` is the chain of manifests committed with
conditional writes (and the claim prune and compaction take in it); `cache` brings a cache folder
up to date from the latest manifest and downloads parts when they are read; `sync` uploads what
was committed since the last sync beside the job; `store` is the checkpoint that does all that;
`compaction` merges segments by level (and holds the claim), `pruning` is the bucket's prune.
docs/scoring.md, "A store in the bucket", is the reference.
"""
