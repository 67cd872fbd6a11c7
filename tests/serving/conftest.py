"""The real servers the serving tests run against: the streaming tests' nginx-rtmp, started per test."""

from __future__ import annotations

from tests.streaming.conftest import nginx_rtmp

__all__ = ["nginx_rtmp"]
