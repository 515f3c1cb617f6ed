"""Records one component writes and another reads, one module per record.

Each module owns its file name, a format version that its reader checks, and
a typed view of the fields its readers use, so that no component reads
another's files by string keys or path patterns. No TFX import.
"""
