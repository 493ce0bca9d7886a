"""kimi-cluster:kernelCache: the S3-compatible bucket the engine's compiled kernels are kept in between bring-ups."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kimi_cluster.settings import rules
from kimi_cluster.settings.errors import shown
from kimi_cluster.settings.rules import DURATION_MAX_MINUTES, PREFIX_RE, S3_REGION_RE, duration_problem


class KernelCacheSettings(BaseModel):
    """Where the engine's compiled kernels are kept between bring-ups: an S3-compatible bucket the team owns.

    AWS S3, Cloudflare R2, Backblaze B2, MinIO and other S3 APIs all take the same client with another endpointUrl.
    The credentials are a secret of their own (kernelCacheCredentials) and reach the nodes on stdin only.
    """

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    backend: Literal["s3"] = "s3"
    bucket: str
    prefix: str = "kimi-cluster/kernel-cache/"
    endpoint_url: str | None = Field(None, alias="endpointUrl")
    region: str = "us-east-1"
    addressing_style: Literal["auto", "path", "virtual"] = Field("auto", alias="addressingStyle")
    restore_timeout_minutes: int = Field(20, alias="restoreTimeoutMinutes", ge=1,
                                         le=DURATION_MAX_MINUTES)
    save_timeout_minutes: int = Field(30, alias="saveTimeoutMinutes", ge=1,
                                      le=DURATION_MAX_MINUTES)

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str) -> str:
        return rules.bucket_name(v)

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_url(cls, v: str | None) -> str | None:
        return rules.endpoint_url(v)

    @field_validator("restore_timeout_minutes", "save_timeout_minutes", mode="before")
    @classmethod
    def _transfer_minutes(cls, v: Any) -> Any:
        problem = duration_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not PREFIX_RE.match(v) or ".." in v.split("/"):
            raise ValueError(f"{shown(v)} is not a plain key prefix (letters, digits, '.', '_', '-', '/')")
        v = v.strip("/")
        return v + "/" if v else ""

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not S3_REGION_RE.match(v):
            raise ValueError(f"{shown(v)} is not a region name such as eu-central-1 or auto")
        return v

    @property
    def location(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"
