"""The Ray engine: Ray Data reads and repartitions the inputs, scoring actors each hold a model,
the driver commits what comes back. Imported only with --ray."""
