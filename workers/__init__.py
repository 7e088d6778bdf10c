"""The Celery side: `celery -A workers worker -Q generate` (one per GPU) and `-Q upload` (the uploader)."""

from workers.app import app

__all__ = ["app"]
