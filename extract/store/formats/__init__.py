"""Readers of the feature files other VL projects write, one module per format, each registered as an
import-only `Format` in extract/store/interop.py (`vlbert cache import --format NAME`).

Each reader returns the store's meta.json and its records, (where in the source, image id, record);
`import_store` checks every record against that meta.json and every id (one place for all formats),
and builds the store beside `--out`. What a format holds is read as its writer lays it out (the
facts are in each module's docstring); pickled parts load only through vlbert/utils/pickles.py.
"""
