"""The preview page served by streaming.app (package data)."""
