"""Parquet shards, run manifests, the DuckDB catalog and exports."""

from storage.corpus import DEFAULT_ROOT, Corpus
from storage.exports import export_selection, export_trl
from storage.integrity import CorpusDamaged
from storage.object_store import ObjectCorpus  # registers its s3:// roots with Corpus (storage.corpus.STORES)

__all__ = ["DEFAULT_ROOT", "Corpus", "CorpusDamaged", "export_selection", "ObjectCorpus", "export_selection", "export_trl"]
