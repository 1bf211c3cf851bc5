"""Parquet shards, run manifests, the DuckDB catalog and exports."""

from storage.corpus import DEFAULT_ROOT, Corpus
from storage.exports import export_selection, export_trl

__all__ = ["DEFAULT_ROOT", "Corpus", "export_selection", "export_trl"]
