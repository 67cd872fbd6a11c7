"""The preview page served by serving.app (package data)."""
