"""Every location clef is given or a record names, resolved and fenced in one room. `uris` tells
what a location string is (a local path, a local-filesystem URI, an object in a store) and
normalises object URIs; `object_store` is the one client for objects (filesystems, retries,
listings, stamps, reads, the store's errors sorted); `uploads` checks an output can be put and
puts it whole; `fence` decides whether a record may read a location (the input's folder,
--media-root) and opens local files inside their roots; `remote_fetch` is the one http(s)
fetcher a record's media go through, each hop's address checked public by `public_address`.
Inputs, encoding, the store and the CLI ask here and never parse a location themselves, so one
check guards them all. This room imports only the shared bottom (`clef_cli.errors`).
"""
