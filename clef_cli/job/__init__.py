"""A scoring run's own room, between engines/ and store/: what the user said (`settings`), the
lifecycle every engine runs a job through (`lifecycle`: locks, manifest, store, provenance), the
final writers (`output`) and what the job reports back (`summary`)."""
