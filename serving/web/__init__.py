"""The preview page served by serving.http (package data)."""
