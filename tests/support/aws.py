"""The one way tests point boto3 at moto's S3 server: fake credentials, no real AWS config reachable."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

FAKE_REGION = "us-east-1"
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def use_fake_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, endpoint_url: str | None = None) -> None:
    """Fake credentials and region for this test, no profile or config file from this machine, and
    boto3's cached default session dropped (it keeps what an earlier test's environment gave it)."""
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", FAKE_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    if endpoint_url is not None:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_url)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
