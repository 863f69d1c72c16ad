"""Bundled public traces (see README.md in this folder for licenses and citations)."""
