"""Which files a DATA argument names, checked before any row is read (and before Redis is asked).

DATA is one of:
- a JSONL file: `.jsonl`, `.jsonl.gz` or `.jsonl.zst`;
- a Parquet file (`.parquet`);
- a folder: every JSONL or Parquet file under it, recursively, in sorted path order. Names starting
  with "." or "_" (hidden files, _SUCCESS, _metadata) and side files (`SIDE_FILE_SUFFIXES`,
  `SIDE_FILE_NAMES`) are skipped; any other file (a `.json`, a `.csv`) is an error rather than
  data silently left out;
- a Hugging Face `datasets` folder written by `Dataset.save_to_disk` (it has a `state.json`): its
  `.arrow` shards, Arrow IPC streams, in the order `state.json` lists them. `datasets` itself is
  not needed. A `DatasetDict` folder is refused: pass one split's folder;
- any of the above on S3: `s3://bucket/key` for a file, `s3://bucket/prefix/` (trailing slash)
  for a folder.

Light on purpose (no pyarrow): `enqueue` checks a local DATA with it before it reaches for Redis.
Reading the rows is intake/input_files.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from core.s3 import S3_SCHEME
from core.safe_paths import stays_inside
from intake.errors import SourceError
from intake.input_stores import InputFiles, LocalInputFiles, S3InputFiles

HF_STATE_FILE = "state.json"
HF_DATASET_DICT_FILE = "dataset_dict.json"
MAX_STATE_FILE_BYTES = 16 * 1024 * 1024  # a state.json lists shards: a few KB even for thousands of them
SIDE_FILE_SUFFIXES = (".md", ".txt", ".yaml", ".yml", ".crc")
SIDE_FILE_NAMES = frozenset({"dataset_info.json", "dataset_infos.json", "config.json"})
SKIPPED_NAME_PREFIXES = (".", "_")


class FileKind(Enum):
    JSONL = "jsonl"
    JSONL_GZIP = "jsonl.gz"
    JSONL_ZSTD = "jsonl.zst"
    PARQUET = "parquet"
    ARROW_STREAM = "arrow"  # the shards of a Hugging Face save_to_disk folder


SUFFIX_KINDS = {
    ".jsonl": FileKind.JSONL,
    ".jsonl.gz": FileKind.JSONL_GZIP,
    ".jsonl.zst": FileKind.JSONL_ZSTD,
    ".parquet": FileKind.PARQUET,
}
SUPPORTED_SUFFIXES = ", ".join(SUFFIX_KINDS)


@dataclass(frozen=True, slots=True)
class DataFile:
    name: str  # the store's name for it (a path or an S3 key)
    kind: FileKind
    label: str  # shown as SourceRow.file: the path inside a folder, empty for a one-file DATA


def check_data(data: str) -> None:
    """What can be said of DATA before any service is asked (SourceError): it is not empty, an S3 URL
    names a bucket, and a local file or folder exists and holds files of a known type."""
    if not data.strip():
        raise SourceError("DATA is empty: pass a file, a folder or an s3:// URL")
    if data.startswith(S3_SCHEME):
        S3InputFiles.check_url(data)
        return
    data_files(LocalInputFiles(Path(data)), data)


def data_files(store: InputFiles, data: str) -> list[DataFile]:
    if store.is_file(data):
        return [DataFile(name=data, kind=_kind_of(data, store), label="")]
    relative = store.list_under(data)
    if HF_DATASET_DICT_FILE in relative.values():
        raise SourceError(f"{data} is a DatasetDict folder: pass one split's folder, e.g. {data}/train")
    if HF_STATE_FILE in relative.values():
        return _hugging_face_shards(store, data)
    files = [
        DataFile(name=name, kind=_kind_of(name, store), label=relative[name])
        for name in sorted(relative, key=relative.__getitem__)
        if not _is_side_file(relative[name])
    ]
    if not files:
        raise SourceError(f"{data}: no {SUPPORTED_SUFFIXES} files in it")
    return files


def _is_side_file(relative_name: str) -> bool:
    parts = relative_name.split("/")
    if any(part.startswith(SKIPPED_NAME_PREFIXES) for part in parts):
        return True
    name = parts[-1].lower()
    return name in SIDE_FILE_NAMES or name.endswith(SIDE_FILE_SUFFIXES)


def _kind_of(name: str, store: InputFiles) -> FileKind:
    lowered = name.lower()
    for suffix, kind in SUFFIX_KINDS.items():
        if lowered.endswith(suffix):
            return kind
    raise SourceError(
        f"{name}: unknown file type; expected {SUPPORTED_SUFFIXES}, a folder of them, "
        "or a Hugging Face save_to_disk folder (a .json file of one object per line: rename it .jsonl)"
    )


def _hugging_face_shards(store: InputFiles, folder: str) -> list[DataFile]:
    state_name = _join(folder, HF_STATE_FILE)
    try:
        state = json.loads(store.read_text(state_name, MAX_STATE_FILE_BYTES))
        shard_names = [entry["filename"] for entry in state["_data_files"]]
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise SourceError(f"{state_name}: not a datasets state file ({error!r})") from error
    if not shard_names:
        raise SourceError(f"{state_name}: lists no data files")
    escaping = [name for name in shard_names if not isinstance(name, str) or not stays_inside(name)]
    if escaping:
        raise SourceError(
            f"{state_name}: data file {escaping[0]!r} is not a plain name inside {folder}: refused"
        )
    shards = []
    for shard_name in shard_names:
        name = _join(folder, shard_name)
        if not store.is_file(name):
            raise SourceError(f"{name}: listed in {HF_STATE_FILE} but missing")
        shards.append(DataFile(name=name, kind=FileKind.ARROW_STREAM, label=shard_name))
    return shards


def _join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}"
