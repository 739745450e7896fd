"""The ground floor every package stands on: whole-file writes, locks, output paths, progress, devices,
threads, CPU kernel families, precisions, the user's errors, the typed config loader and the safe readers
of pickles, torch files and records. It imports nothing else of the project (tests/test_registries.py),
and importing one of its modules loads neither torch nor transformers unless that module needs them."""
