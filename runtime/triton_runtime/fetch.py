"""Fetch a model from hf://, s3://, gs:// or pvc:// into a local folder.

Credentials come only from the environment, which the operator fills from the Secret named in
spec.model.credentialsSecret (HF_TOKEN; AWS_*; GOOGLE_APPLICATION_CREDENTIALS). Cloud clients are
imported only for the scheme in use, with a clear message when one is missing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# The operator mounts pvc://CLAIM/... read-only at <PVC_ROOT>/CLAIM.
PVC_ROOT = Path(os.environ.get("TRITON_RUNTIME_PVC_ROOT", "/mnt/pvc"))


class FetchError(RuntimeError):
    pass


def split(source: str) -> tuple[str, str, str]:
    """(scheme, first part, rest): hf://org/name, s3://bucket/prefix, pvc://claim/path."""
    scheme, sep, rest = source.partition("://")
    if not sep or scheme not in ("hf", "s3", "gs", "pvc"):
        raise FetchError(f"unsupported model source {source!r}: use hf://, s3://, gs:// or pvc://")
    head, _, tail = rest.partition("/")
    return scheme, head, tail


def local_path(source: str) -> Path | None:
    """pvc:// sources are already on disk: no copy."""
    scheme, claim, path = split(source)
    if scheme != "pvc":
        return None
    where = PVC_ROOT / claim / path
    if not where.exists():
        raise FetchError(f"{source}: {where} does not exist in the mounted claim {claim}")
    return where


def fetch(source: str, dest: Path, revision: str | None = None) -> Path:
    """The model's files on local disk (dest, or the pvc mount itself)."""
    on_disk = local_path(source)
    if on_disk is not None:
        return on_disk
    scheme, head, tail = split(source)
    dest.mkdir(parents=True, exist_ok=True)
    if scheme == "hf":
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise FetchError("hf:// needs the huggingface_hub package in this image") from None
        snapshot_download(repo_id=f"{head}/{tail}", revision=revision or "main", local_dir=str(dest),
                          token=os.environ.get("HF_TOKEN") or None)
        return dest
    if scheme == "s3":
        try:
            import boto3
        except ImportError:
            raise FetchError("s3:// needs the boto3 package in this image") from None
        bucket = boto3.resource("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None).Bucket(head)
        found = False
        for obj in bucket.objects.filter(Prefix=tail):
            if obj.key.endswith("/"):
                continue
            target = dest / os.path.relpath(obj.key, tail or ".")
            target.parent.mkdir(parents=True, exist_ok=True)
            bucket.download_file(obj.key, str(target))
            found = True
        if not found:
            raise FetchError(f"{source}: no objects under that prefix")
        return dest
    try:
        from google.cloud import storage
    except ImportError:
        raise FetchError("gs:// needs the google-cloud-storage package in this image") from None
    blobs = [b for b in storage.Client().list_blobs(head, prefix=tail) if not b.name.endswith("/")]
    if not blobs:
        raise FetchError(f"{source}: no objects under that prefix")
    for blob in blobs:
        target = dest / os.path.relpath(blob.name, tail or ".")
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))
    return dest


def copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, dirs_exist_ok=True)
