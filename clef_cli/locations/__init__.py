"""Every location clef is given or a record names, resolved and fenced in one room: `object_store`
(objects in a store: normalised locations, listings, reads, the store's errors sorted) and `fence`
(local media paths opened inside their --media-root folders)."""
