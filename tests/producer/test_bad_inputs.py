"""Every bad input gets a clear answer and nothing is lost (issue 11).

Each case runs one `python -m producer` command against a real redis-server, in this process through
`producer.cli.main` (a handful as processes of their own), and checks: the exit code (2 for what the
user must change, 1 for a failure, 130 for Ctrl-C), a short error naming the option or row and why,
no traceback, and what must hold afterwards: nothing pinned, a run pinned before unchanged, or exactly
the good rows enqueued.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import redis

from core.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from core.records import Prompt, PromptBatch
from devstack.local_stack import wait_until
from producer.cli import main
from producer.enqueue.processes import part_of
from producer.errors import S3_HINT
from producer.settings import REDIS_URL_ENV
from tests.support.bad_inputs import (
    BROKEN,
    DEAD_ERROR,
    PINNED,
    REPOSITORY_ROOT,
    RUN,
    Case,
    Outcome,
    World,
    all_of,
    argv_for,
    broken_run,
    broken_unchanged,
    busy_run,
    empty_folder,
    enqueued,
    env_for,
    filled_folder,
    foreign_run_output,
    kept_column_types,
    linked_folders,
    named_pipe,
    no_state,
    nothing_pinned,
    pinned_mapped_run,
    pinned_run,
    pinned_run_and_filled_folder,
    pinned_run_in_default_output,
    pinned_run_keeping_lang,
    pinned_run_with_rejects,
    pinned_unchanged,
    rows,
    run_in_subprocess,
    run_json_in,
    write_inputs,
)
from workers.state.codec import decode_blob
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.record_limits import RECORD_LIMIT_BYTES

pytestmark = pytest.mark.integration

DATA = "{tmp}/data.jsonl"
OUT = "{tmp}/out"
NEW_RUN = ("enqueue", DATA, "--run", RUN, "--output", OUT)  # a valid first enqueue: cases add one bad thing
DATA_IDS = {"q0", "q1", "q2"}
MAPPED_QUESTIONS = ("--prompt-field", "question", "--id-field", "uid")
MAPPED_DIALOGS = (
    "--messages-field",
    "dialog",
    "--id-field",
    "conv_id",
    "--turn-keys",
    "speaker,text",
    "--roles",
    "human=user,bot=assistant",
)
RETRY_HELPS = "a retry helps"
NO_AWS_CREDENTIALS = {
    "AWS_CONFIG_FILE": "{tmp}/no-aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "{tmp}/no-aws-credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:1",  # nothing listens: no request could leave this machine
}


def enqueue_with(*options: str) -> tuple[str, ...]:
    return (*NEW_RUN, *options)


def refused(case_id: str, options: tuple[str, ...], *words: str, **more: object) -> Case:
    """A first enqueue refused with exit 2 for one bad option, leaving nothing pinned or written."""
    return Case(case_id, enqueue_with(*options), EXIT_USAGE, words, nothing_pinned(), **more)  # type: ignore[arg-type]


REDIS_UNREACHABLE = [
    Case(
        f"redis-{state}-{command[0]}",
        command,
        EXIT_FAILED,
        ("error: Redis at", *reasons, RETRY_HELPS),
        nothing_pinned(),
        redis=state,
    )
    for state, reasons in (
        ("closed", ("Connection refused",)),
        (
            "wrong-password",
            ("invalid username-password pair", "set DRAFTGEN_REDIS_URL", "redis-producer.env"),
        ),
        ("no-password", ("refused the login (it asks for a user and password): set DRAFTGEN_REDIS_URL",)),
    )
    for command in (
        NEW_RUN,
        ("verify", "--run", RUN),
        ("files", "--run", RUN),
        ("gc", "--run", RUN),
        ("rejects", "--run", RUN),
        ("recover", "--run", RUN, "--output", "{tmp}/elsewhere"),
    )
]

REDIS_UNREACHABLE.extend(
    Case(  # what no pinned run can make right is said first: fixing Redis would not help
        f"redis-closed-and-{what}",
        argv,
        EXIT_USAGE,
        words,
        nothing_pinned(),
        redis="closed",
    )
    for what, argv, words in (
        ("a-nan-option", enqueue_with("--temperature", "nan"), ("--temperature nan", "finite")),
        (
            "a-missing-input",
            ("enqueue", "{tmp}/nope.jsonl", "--run", RUN, "--output", OUT),
            ("nope.jsonl: no such file or folder",),
        ),
        (
            "an-input-of-unknown-type",
            ("enqueue", "{tmp}/data.csv", "--run", RUN, "--output", OUT),
            ("data.csv: unknown file type",),
        ),
    )
)

OUTPUTS = [
    refused("output-empty", ("--output", ""), "--output", "the output is empty"),
    refused("output-blank", ("--output", "   "), "--output", "the output is empty"),
    refused("output-s3-without-bucket", ("--output", "s3://"), "'s3://' names no bucket"),
    refused("output-s3-triple-slash", ("--output", "s3:///x"), "'s3:///x' names no bucket"),
    refused(
        "output-file-url-with-a-host",
        ("--output", "file://relative{tmp}/out"),
        "names the host 'relative'",
        "file:///absolute/path",
    ),
    refused("output-is-a-file", ("--output", "{tmp}/afile"), "--output", "afile' is a file, not a folder"),
    refused("output-dev-null", ("--output", "/dev/null"), "'/dev/null' is a character device, not a folder"),
    refused("output-under-proc", ("--output", "/proc/draftgen-x"), "under /proc", "not storage"),
    refused("output-under-sys", ("--output", "/sys/draftgen-x"), "under /sys", "not storage"),
    refused(
        "output-through-a-file", ("--output", "{tmp}/afile/sub"), "cannot be a folder", "afile' is a file"
    ),
    refused("output-other-scheme", ("--output", "ftp://host/x"), "output must be a folder"),
    refused("output-with-a-newline", ("--output", "{tmp}/out\nrm"), "holds a control character ('\\n')"),
    refused(
        "output-file-url-with-a-percent-encoded-newline",
        ("--output", "file://{tmp}/out%0Arm"),
        r"/out\nrm' holds a control character ('\n')",
    ),
    refused(
        "output-system-folder",
        ("--output", "/etc/draftgen"),
        "'/etc/draftgen' is under /etc, a system folder",
    ),
    refused("output-root", ("--output", "/"), "'/' is the root of the file system"),
    *[
        refused(f"output-{what}", ("--output", where), words, "--allow-location if you mean it")
        for what, where, words in (
            (
                "a-hidden-folder-of-roots-home",
                "/root/.draftgen-test",
                "inside /root/.draftgen-test, a hidden",
            ),
            ("a-home-folder", "/home/draftgen-test", "'/home/draftgen-test' is a home folder"),
            ("under-var", "/var/spool/cron/crontabs", "is under /var: not a place for a run's files"),
            ("under-opt", "/opt/draftgen-test", "is under /opt"),
            ("srv", "/srv", "'/srv' is under /srv"),
        )
    ],
    refused(
        "output-an-existing-folder-holding-other-files",
        ("--output", "{tmp}/filled"),
        "filled' already holds files that are not this run's (notes.txt): give a new or empty folder",
        setup=filled_folder,
    ),
    Case(
        "export-to-a-folder-holding-other-files",
        ("export", "--run", PINNED, "--format", "sharegpt", "--to", "{tmp}/filled"),
        EXIT_USAGE,
        ("--to: ", "filled' already holds files that are not this run's (notes.txt)"),
        pinned_unchanged,
        setup=pinned_run_and_filled_folder,
    ),
    Case(
        "output-an-existing-empty-folder-is-the-runs",
        (*NEW_RUN[:-1], "{tmp}/empty"),
        EXIT_OK,
        ("new                 3 prompts",),
        all_of(enqueued(DATA_IDS), run_json_in("empty")),
        setup=empty_folder,
    ),
    refused(
        "output-dot-dot-into-a-system-folder",
        ("--output", "{tmp}/../../../../../../../usr/draftgen"),
        "'/usr/draftgen' is under /usr, a system folder",
    ),
    Case(
        "output-dot-dot-through-a-link",
        enqueue_with("--output", "{tmp}/a/link/../out"),
        EXIT_USAGE,
        ("goes through '..' to", "/b/out', not", "/a/out' as it reads"),
        nothing_pinned(),
        setup=linked_folders,
    ),
    Case(
        "output-inside-another-runs-output",
        (*NEW_RUN[:-1], "{tmp}/pinned-out/sub"),
        EXIT_USAGE,
        ("pinned-out/sub is inside file://", "/pinned-out, the output of run 'pinned'", "an --output of its"),
        all_of(nothing_pinned(), pinned_unchanged),
        setup=pinned_run,
    ),
    Case(
        "output-inside-a-run-output-redis-does-not-know",
        (*NEW_RUN[:-1], "{tmp}/pinned-out/sub"),
        EXIT_USAGE,
        ("pinned-out/sub' is inside", "pinned-out', a run's output (it holds run.json)"),
        nothing_pinned(),
        setup=foreign_run_output,
    ),
    Case(
        "output-holding-another-runs-output",
        (*NEW_RUN[:-1], "{tmp}"),
        EXIT_USAGE,
        ("holds file://", "/pinned-out, the output of run 'pinned'", "an --output of its own"),
        all_of(nothing_pinned(), pinned_unchanged),
        setup=pinned_run,
    ),
    Case(
        "output-holding-a-run-output-redis-does-not-know",
        (*NEW_RUN[:-1], "{tmp}"),
        EXIT_USAGE,
        ("holds '", "/pinned-out', a run's output (it holds run.json)"),
        nothing_pinned(),
        setup=foreign_run_output,
    ),
    Case(
        "output-unstated-is-the-runs-own-folder-under-./output",
        ("enqueue", DATA, "--run", RUN),
        EXIT_OK,
        ("run r: output file://", "/output/r\n"),
        all_of(enqueued(DATA_IDS), run_json_in("output/r")),
    ),
    Case(
        "output-unstated-is-the-runs-own-under-DRAFTGEN_OUTPUT",
        ("enqueue", DATA, "--run", RUN),
        EXIT_OK,
        ("run r: output file://", "/runs/r\n"),
        all_of(enqueued(DATA_IDS), run_json_in("runs/r")),
        env={"DRAFTGEN_OUTPUT": "runs"},
    ),
    Case(
        "output-unstated-beside-another-runs-default-output",
        ("enqueue", DATA, "--run", RUN),
        EXIT_OK,
        ("run r: output file://", "/output/r\n"),
        all_of(enqueued(DATA_IDS), run_json_in("output/r"), run_json_in("output/pinned", run=PINNED)),
        setup=pinned_run_in_default_output,
    ),
    *[
        Case(
            f"export-{what}",
            ("export", "--run", PINNED, "--format", "sharegpt", "--to", to),
            EXIT_USAGE,
            words,
            pinned_unchanged,
            setup=pinned_run,
        )
        for what, to, words in (
            ("into-the-runs-own-output", "{tmp}/pinned-out/export", ("pinned-out/export: inside the run's",)),
            ("to-dev-null", "/dev/null", ("--to: '/dev/null' is a character device, not a folder",)),
            ("to-a-percent-encoded-newline", "file://{tmp}/x%0Ay", (r"/x\ny' holds a control character",)),
            ("to-a-hidden-home-folder", "/root/.draftgen-test", ("--allow-location if you mean it",)),
        )
    ],
    Case(
        "output-of-another-run",
        (*NEW_RUN[:-1], "{tmp}/pinned-out"),
        EXIT_USAGE,
        ("holds the output of run 'pinned'",),
        all_of(nothing_pinned(), pinned_unchanged),
        setup=pinned_run,
    ),
    *[
        Case(
            f"{side}-s3-without-credentials",
            argv,
            EXIT_FAILED,
            ("s3://draftgen-no-credentials/", "Unable to locate credentials", S3_HINT.strip(), RETRY_HELPS),
            nothing_pinned(),
        )
        for side, argv in (
            ("output", enqueue_with("--output", "s3://draftgen-no-credentials/run")),
            ("input", ("enqueue", "s3://draftgen-no-credentials/d.jsonl", "--run", RUN, "--output", OUT)),
        )
    ],
    Case(
        "verify-output-is-a-file",
        ("verify", "--run", RUN, "--output", "{tmp}/afile"),
        EXIT_USAGE,
        ("--output", "is a file, not a folder"),
        no_state,
    ),
    Case("verify-output-empty", ("verify", "--run", RUN, "--output", ""), EXIT_USAGE, ("empty",), no_state),
    Case(
        "recover-output-dev-null",
        ("recover", "--run", RUN, "--output", "/dev/null"),
        EXIT_USAGE,
        ("'/dev/null' is a character device",),
        no_state,
    ),
]

SAMPLING = [
    refused("temperature-nan", ("--temperature", "nan"), "--temperature nan", "finite"),
    refused("temperature-inf", ("--temperature", "inf"), "--temperature inf", "finite"),
    refused("temperature-negative", ("--temperature", "-1"), "--temperature -1.0", "0 or more"),
    refused("top-p-2", ("--top-p", "2"), "--top-p 2.0", "at most 1"),
    refused("top-p-0", ("--top-p", "0"), "--top-p 0.0", "above 0"),
    refused("top-p-nan", ("--top-p", "nan"), "--top-p nan", "finite"),
    refused("top-k-minus-7", ("--top-k", "-7"), "--top-k -7", "-1 (off) or 1 or more"),
    refused("top-k-0", ("--top-k", "0"), "--top-k 0", "SGLang refuses 0"),
    refused("min-p-5", ("--min-p", "5"), "--min-p 5.0", "between 0 and 1"),
    refused("min-p-negative", ("--min-p", "-0.1"), "--min-p -0.1", "between 0 and 1"),
    refused("max-tokens-huge", ("--max-tokens", "99999999999999"), "--max-tokens 99999999999999", "1048576"),
    refused("max-tokens-0", ("--max-tokens", "0"), "--max-tokens 0", "between 1 and"),
    refused("max-tokens-negative", ("--max-tokens", "-5"), "--max-tokens -5", "between 1 and"),
    refused("seed-beyond-int64", ("--seed", str(2**63)), "--seed", "64 bits"),
    refused("model-empty", ("--model", ""), "--model", "served model"),
    refused("batch-size-huge", ("--batch-size", str(10**8)), "--batch-size 100000000", "4096"),
    refused("batch-size-0", ("--batch-size", "0"), "--batch-size 0", "between 1 and 4096"),
    refused(
        "gate-empty-rate-5", ("--gate-max-empty-rate", "5"), "--gate-max-empty-rate 5.0", "between 0 and 1"
    ),
    refused(
        "gate-truncated-rate-negative",
        ("--gate-max-truncated-rate", "-0.1"),
        "--gate-max-truncated-rate -0.1",
        "between 0 and 1",
    ),
    refused("gate-rate-nan", ("--gate-max-empty-rate", "nan"), "--gate-max-empty-rate nan", "finite"),
    refused(
        "gate-min-completions-0", ("--gate-min-completions", "0"), "--gate-min-completions 0", "between 1"
    ),
    refused(
        "retry-cap-below-max-tokens",
        ("--truncated-thinking", "retry", "--max-tokens", "4096", "--retry-max-tokens-cap", "1000"),
        "--retry-max-tokens-cap 1000",
        "above max_tokens (4096)",
    ),
    refused("retry-cap-huge", ("--retry-max-tokens-cap", "99999999999"), "--retry-max-tokens-cap", "1048576"),
    refused(
        "config-temperature-nan", ("--config", "{tmp}/nan.toml"), "nan.toml: temperature = nan", "finite"
    ),
    refused("config-top-p-2", ("--config", "{tmp}/top-p.toml"), "top-p.toml: top_p = 2.0", "at most 1"),
    refused("config-dev-zero", ("--config", "/dev/zero"), "a settings file /dev/zero is a character device"),
    refused("config-a-folder", ("--config", "{tmp}"), "is a folder, not a file"),
    refused("config-missing", ("--config", "{tmp}/nope.toml"), "cannot read a settings file", "No such file"),
    refused("config-huge", ("--config", "{tmp}/huge.toml"), "huge.toml is over 1 MiB: not a settings file"),
    refused(
        "config-a-named-pipe",
        ("--config", "{tmp}/pipe.toml"),
        "pipe.toml is a named pipe, not a file",
        setup=named_pipe,
    ),
    Case(
        "pinned-run-given-nan",
        ("enqueue", DATA, "--run", PINNED, "--temperature", "nan"),
        EXIT_USAGE,
        ("--temperature nan", "finite"),
        pinned_unchanged,
        setup=pinned_run,
    ),
    Case(
        "pinned-run-given-other-settings",
        ("enqueue", DATA, "--run", PINNED, "--max-tokens", "100"),
        EXIT_USAGE,
        ("sampling.max_tokens: pinned 32768, given 100",),
        pinned_unchanged,
        setup=pinned_run,
        max_error_lines=3,
    ),
]

ENVIRONMENT = [
    refused("env-gpu-abc", (), "DRAFTGEN_GPU='abc'", "whole number", env={"DRAFTGEN_GPU": "abc"}),
    refused("env-gpu-negative", (), "DRAFTGEN_GPU='-1'", "0 or more", env={"DRAFTGEN_GPU": "-1"}),
    refused("env-gpu-fraction", (), "DRAFTGEN_GPU='1.5'", "whole number", env={"DRAFTGEN_GPU": "1.5"}),
    refused("env-port-beyond-65535", (), "port 70000", "1 to 65535", env={"DRAFTGEN_BASE_PORT": "70000"}),
    refused(
        "env-unknown-gpus", (), "DRAFTGEN_GPUS", "did you mean DRAFTGEN_GPU?", env={"DRAFTGEN_GPUS": "0"}
    ),
    refused(
        "env-max-in-flight-0",
        (),
        "DRAFTGEN_MAX_IN_FLIGHT='0'",
        "1 or more",
        env={"DRAFTGEN_MAX_IN_FLIGHT": "0"},
    ),
    refused(
        "env-max-attempts-abc",
        (),
        "DRAFTGEN_MAX_ATTEMPTS",
        "whole number",
        env={"DRAFTGEN_MAX_ATTEMPTS": "x"},
    ),
    refused(
        "env-liveness-maybe",
        (),
        "DRAFTGEN_LIVENESS_ENABLED='maybe'",
        "true",
        env={"DRAFTGEN_LIVENESS_ENABLED": "maybe"},
    ),
    refused(
        "env-upload-age-nan",
        (),
        "DRAFTGEN_UPLOAD_MAX_AGE_S='nan'",
        "finite",
        env={"DRAFTGEN_UPLOAD_MAX_AGE_S": "nan"},
    ),
    Case(
        "env-typo-refused-by-verify",
        ("verify", "--run", RUN),
        EXIT_USAGE,
        ("DRAFTGEN_REDIS_ULR", "did you mean DRAFTGEN_REDIS_URL?"),
        no_state,
        env={"DRAFTGEN_REDIS_ULR": "redis://elsewhere:6379/0"},
    ),
    Case(
        "env-other-components-variables-accepted",
        NEW_RUN,
        EXIT_OK,
        ("new                 3 prompts",),
        enqueued(DATA_IDS),
        env={
            "DRAFTGEN_MODEL_PATH": "/dev/shm/model",
            "DRAFTGEN_MODEL_SOURCE": "s3://b/m",
            "DRAFTGEN_SERVED_MODEL_NAME": "m",
            "DRAFTGEN_SGLANG_HOST": "0.0.0.0",
            "DRAFTGEN_SERVE_ARGS": "--x",
            "DRAFTGEN_PRICE_PER_GPU_HOUR": "3.8",
            "DRAFTGEN_OUTPUT": "/tmp/elsewhere",
            "DRAFTGEN_GPU": "2",
        },
    ),
    refused(
        "env-gpu-abc-own-process", (), "DRAFTGEN_GPU='abc'", env={"DRAFTGEN_GPU": "abc"}, subprocess=True
    ),
    Case(
        "env-gpu-abc-help-still-works",
        ("--help",),
        EXIT_OK,
        ("enqueue", "rejects"),
        no_state,
        env={"DRAFTGEN_GPU": "abc"},
        subprocess=True,
    ),
]

INPUT_ROWS = [
    Case(
        "input-empty-file",
        ("enqueue", "{tmp}/empty.jsonl", "--run", RUN, "--output", OUT),
        EXIT_USAGE,
        ("empty.jsonl: holds no rows",),
        nothing_pinned(),
    ),
    Case(
        "input-only-blank-lines",
        ("enqueue", "{tmp}/blank.jsonl", "--run", RUN, "--output", OUT),
        EXIT_USAGE,
        ("blank.jsonl: holds no rows",),
        nothing_pinned(),
    ),
    Case(
        "input-missing",
        ("enqueue", "{tmp}/nope.jsonl", "--run", RUN, "--output", OUT),
        EXIT_USAGE,
        ("nope.jsonl: no such file or folder",),
        nothing_pinned(),
    ),
    Case(
        "input-unknown-type",
        ("enqueue", "{tmp}/data.csv", "--run", RUN, "--output", OUT),
        EXIT_USAGE,
        ("data.csv: unknown file type",),
        nothing_pinned(),
    ),
    *[
        Case(
            f"input-nul-{where}",
            ("enqueue", f"{{tmp}}/{name}", "--run", RUN, "--output", OUT),
            EXIT_OK,
            ("rejected rows       1", f"row 2: {path}: holds a NUL character"),
            enqueued(ids, rejected=1),
        )
        for where, name, path, ids in (
            ("prompt", "nul.jsonl", "prompt", {"q0", "q2"}),
            ("system", "nul-system.jsonl", "system", {"q0"}),
            ("id", "nul-id.jsonl", "id", {"q0"}),
            ("content-part", "nul-part.jsonl", "messages[0].content[0].text", {"q0"}),
        )
    ],
    Case(
        "input-every-row-in-other-columns",
        ("enqueue", "{tmp}/questions.jsonl", "--run", RUN, "--output", OUT),
        EXIT_USAGE,
        (
            "questions.jsonl: all its 3 rows are rejected, nothing to enqueue",
            "row 1: no messages, conversations or prompt field (its fields: uid, question, answer; "
            "--prompt-field or --messages-field maps one)",
        ),
        nothing_pinned(),
    ),
    Case(
        "input-columns-mapped",
        ("enqueue", "{tmp}/questions.jsonl", "--run", RUN, "--output", OUT, *MAPPED_QUESTIONS),
        EXIT_OK,
        ("new                 3 prompts",),
        enqueued({"u0", "u1", "u2"}),
    ),
    Case(
        "input-chat-shape-mapped",
        ("enqueue", "{tmp}/dialogs.jsonl", "--run", RUN, "--output", OUT, *MAPPED_DIALOGS),
        EXIT_OK,
        ("new                 3 prompts",),
        enqueued({"c0", "c1", "c2"}),
    ),
    Case(
        "input-chat-shape-unmapped",
        ("enqueue", "{tmp}/dialogs.jsonl", "--run", RUN, "--output", OUT, "--messages-field", "dialog"),
        EXIT_USAGE,
        (
            "dialogs.jsonl: all its 3 rows are rejected, nothing to enqueue",
            "row 1: dialog[0].role: is missing (a turn is {role, content} or ShareGPT {from, value}; "
            "--turn-keys ROLE,TEXT reads others)",
        ),
        nothing_pinned(),
    ),
    refused("input-chat-role-unknown", ("--roles", "bot=robot"), "--roles {'bot': 'robot'}: bot=robot"),
    Case(
        "input-columns-mapped-otherwise-on-re-enqueue",
        ("enqueue", "{tmp}/questions.jsonl", "--run", PINNED, "--prompt-field", "answer"),
        EXIT_USAGE,
        ("prompt_field: pinned 'question', given 'answer'",),
        pinned_unchanged,
        setup=pinned_mapped_run,
        max_error_lines=3,
    ),
    Case(
        "input-column-name-empty",
        enqueue_with("--prompt-field", " "),
        EXIT_USAGE,
        ("--prompt-field ' ': must be a column name",),
        nothing_pinned(),
    ),
    Case(
        "input-every-row-over-the-row-limit",
        enqueue_with("--max-row-bytes", "20"),
        EXIT_USAGE,
        ("all its 3 rows are rejected", "row 1: row is 36 bytes, over the limit of 20"),
        nothing_pinned(),
    ),
    Case(
        "input-conflict-in-one-file",
        ("enqueue", "{tmp}/conflict.jsonl", "--run", RUN, "--output", OUT),
        EXIT_OK,
        (
            "conflicting ids     1",
            "row 3: id 'q0' conflicts with row 1 of this input",
            "kept row 1's version",
            "duplicate ids       0",
        ),
        enqueued({"q0", "q1"}, rejected=1),
    ),
    Case(
        "input-exact-duplicate-in-one-file",
        ("enqueue", "{tmp}/duplicate.jsonl", "--run", RUN, "--output", OUT),
        EXIT_OK,
        ("duplicate ids       1",),
        enqueued({"q0", "q1"}),
    ),
    Case(
        "input-conflict-on-re-enqueue",
        ("enqueue", "{tmp}/changed.jsonl", "--run", PINNED),
        EXIT_OK,
        (
            "conflicting ids     1",
            "row 1: id 'q0' conflicts with row 1 of enqueue 1 (",
            "data.jsonl at ",
            "kept the version enqueued then",
            "new                 1 prompts",
        ),
        enqueued({*DATA_IDS, "q9"}, rejected=1, run=PINNED),
        setup=pinned_run,
    ),
    Case(
        "input-same-content-on-re-enqueue",
        ("enqueue", DATA, "--run", PINNED),
        EXIT_OK,
        ("already there       3", "new                 0 prompts"),
        pinned_unchanged,
        setup=pinned_run,
    ),
]

RUN_NAMES = [
    Case(
        f"run-name-{label}",
        ("enqueue", DATA, "--run", name, "--output", OUT),
        EXIT_USAGE,
        words,
        all_of(nothing_pinned(name), no_state),
    )
    for label, name, words in (
        ("500-characters", "x" * 500, ("500 characters long", "at most 128")),
        ("reserved", "workers", ("'workers' is reserved",)),
        ("climbing-out", "../etc", ("must start with a letter or digit",)),
        ("empty", "", ("must start with a letter or digit",)),
    )
]

RUN_STATE = [
    *[
        Case(
            f"broken-settings-{command[0]}",
            command,
            EXIT_FAILED,
            ("run 'broken': its pinned settings in Redis are unreadable", "recover"),
            broken_unchanged,
            setup=broken_run,
        )
        for command in (
            ("files", "--run", BROKEN),
            ("verify", "--run", BROKEN),
            ("gc", "--run", BROKEN),
            ("enqueue", DATA, "--run", BROKEN),
        )
    ],
    Case("unknown-run-files", ("files", "--run", RUN), EXIT_USAGE, ("no run named 'r'",), no_state),
    Case("unknown-run-gc", ("gc", "--run", RUN), EXIT_USAGE, ("no run named 'r'",), no_state),
    Case(
        "enqueue-while-another-runs",
        ("enqueue", DATA, "--run", PINNED),
        EXIT_FAILED,
        ("another enqueue of run 'pinned' is at work", RETRY_HELPS),
        pinned_unchanged,
        setup=busy_run,
    ),
]

LISTINGS = [
    Case(
        "rejects-lists-rows-and-dead-letters",
        ("rejects", "--run", PINNED),
        EXIT_OK,
        (
            "1 rows rejected at enqueue, 1 prompts dead-lettered",
            "nul.jsonl row 2: prompt: holds a NUL character",
            f"q2 (row 3): rejected_by_server after 1 attempt: {DEAD_ERROR}",
        ),
        pinned_unchanged,
        setup=pinned_run_with_rejects,
    ),
    Case(
        "rejects-json",
        ("rejects", "--run", PINNED, "--json"),
        EXIT_OK,
        ('"rejected":[{"source":', '"row":2', '"dead":[{"prompt_id":"q2"', DEAD_ERROR),
        pinned_unchanged,
        setup=pinned_run_with_rejects,
    ),
    Case(
        "rejects-from-the-output-alone",
        ("rejects", "--run", PINNED, "--output", "{tmp}/pinned-out", "--only", "rejected"),
        EXIT_OK,
        ("nul.jsonl row 2: prompt: holds a NUL character",),
        pinned_unchanged,
        setup=pinned_run_with_rejects,
        redis="closed",
    ),
    Case("rejects-unknown-run", ("rejects", "--run", RUN), EXIT_USAGE, ("no run named 'r'",), no_state),
    Case(
        "report-out-a-device",
        ("report", "--run", PINNED, "--out", "/dev/null"),
        EXIT_USAGE,
        ("--out: '/dev/null' is a character device, not a folder",),
        pinned_unchanged,
        setup=pinned_run,
    ),
    Case(
        "rejects-output-a-device",
        ("rejects", "--run", RUN, "--output", "/dev/zero"),
        EXIT_USAGE,
        ("--output: '/dev/zero' is a character device, not a folder",),
        no_state,
    ),
    Case(
        "wait-unknown-run-answered-with-the-known-runs",
        ("wait", "--run", "pined"),
        EXIT_USAGE,
        ("no run named 'pined' in Redis: Redis knows pinned", "`python -m producer runs` lists them"),
        pinned_unchanged,
        setup=pinned_run,
    ),
    Case(
        "status-unknown-run-in-an-empty-redis",
        ("status", "--run", RUN),
        EXIT_USAGE,
        ("Redis knows no run yet; start one with `python -m producer enqueue DATA --run r`",),
        no_state,
    ),
    refused("keep-columns-an-exported-key", ("--keep-columns", "lang,run"), "column 'run' would clash"),
    refused(
        "keep-columns-a-chat-template-variable",
        ("--keep-columns", "tools"),
        "column 'tools' would reach SpecForge's chat template",
    ),
    refused(
        "keep-columns-star-and-more", ("--keep-columns", "*,lang"), "'*' keeps every column: name it alone"
    ),
    refused("keep-columns-twice", ("--keep-columns", "lang,lang"), "names a column twice"),
    Case(
        "keep-columns-star-finding-an-exported-key",
        ("enqueue", "{tmp}/with-metadata.jsonl", "--run", RUN, "--output", OUT, "--keep-columns", "*"),
        EXIT_USAGE,
        ("--keep-columns *: column 'metadata' would clash", "name the columns to keep"),
        nothing_pinned(),
    ),
    Case(
        "keep-columns-typed-by-the-first-rows",
        ("enqueue", "{tmp}/with-columns.jsonl", "--run", RUN, "--output", OUT, "--keep-columns", "*"),
        EXIT_OK,
        ("new                 3 prompts", "rejected rows       0"),
        all_of(
            enqueued({"q0", "q1", "q2"}),
            kept_column_types({"lang": "json", "source": "string", "score": "float", "tags": "json"}),
        ),
    ),
    Case(
        "keep-columns-a-later-row-of-another-type-is-rejected",
        ("enqueue", "{tmp}/later-columns.jsonl", "--run", PINNED),
        EXIT_OK,
        (
            "rejected rows       1",
            "row 2: column 'lang': 4 is an integer; the run keeps 'lang' as a string",
        ),
        enqueued({"q0", "q1", "q2", "q3", "q5"}, rejected=1, run=PINNED),
        setup=pinned_run_keeping_lang,
    ),
    Case("runs-in-an-empty-redis", ("runs",), EXIT_OK, ("Redis knows no run yet",), no_state),
    Case(
        "runs-lists-each-run-with-its-state-and-output",
        ("runs",),
        EXIT_OK,
        ("RUN ", "pinned  waiting for the first completion  0/3 0.0%", "/pinned-out\n"),
        pinned_unchanged,
        setup=pinned_run,
    ),
]

CASES = [
    *REDIS_UNREACHABLE,
    *OUTPUTS,
    *SAMPLING,
    *ENVIRONMENT,
    *INPUT_ROWS,
    *RUN_NAMES,
    *RUN_STATE,
    *LISTINGS,
]


@pytest.fixture
def world(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for name in list(os.environ):
        if name.startswith(("DRAFTGEN_", "AWS_")):
            monkeypatch.delenv(name)
    for name, value in NO_AWS_CREDENTIALS.items():  # and no way to find any: no file, no instance role
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    # boto3's default session keeps the credentials an earlier test's client found in the environment
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.chdir(tmp_path)  # a relative output the old code accepted lands here, never in the repo
    monkeypatch.setenv(REDIS_URL_ENV, redis_url)  # setups and the tests below run against it
    write_inputs(tmp_path)
    client = redis.Redis.from_url(redis_url)
    yield World(tmp=tmp_path, client=client, redis_url=redis_url)
    client.close()


def run_case(
    case: Case, world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Outcome:
    argv = argv_for(case, world)
    env = env_for(case, world)
    if case.subprocess:
        return run_in_subprocess(argv, env, world.tmp)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()  # what the setup printed
    code = main(argv)
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def test_the_table_covers_every_kind_of_bad_input() -> None:
    assert len(CASES) >= 60
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_bad_input_gets_a_clear_answer_and_nothing_is_lost(
    case: Case, world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if case.setup is not None:
        case.setup(world)
    outcome = run_case(case, world, capsys, monkeypatch)
    said = outcome.stderr if outcome.exit_code != EXIT_OK else outcome.stdout
    assert outcome.exit_code == case.exit_code, outcome
    for words in case.words:
        assert words in said, f"{words!r} not in: {said}"
    assert "Traceback" not in outcome.stderr
    if outcome.exit_code != EXIT_OK:
        lines = outcome.stderr.strip().splitlines()
        assert lines[0].startswith("error: "), outcome.stderr
        assert len(lines) <= case.max_error_lines, outcome.stderr
    case.after(world)


# --- Ctrl-C: a process of its own, interrupted while it waits for more input -------------------

FIFO_ROWS_WRITTEN = 200
FIFO_BATCH_SIZE = 2
CHUNK_PROMPTS = FIFO_BATCH_SIZE * 32  # producer.enqueue.enqueuer.BATCHES_PER_CHUNK batches per chunk
ALL_ROWS = 300
WAIT_S = 30.0


def whole_chunks(processes: int) -> int:
    """The prompts enqueued before it blocks reading: each process's share of the rows written, in whole
    chunks (a part of a chunk waits in the reading process)."""
    shares = Counter(
        part_of(Prompt(id=str(row["id"]), messages=[]), processes) for row in rows(FIFO_ROWS_WRITTEN)
    )
    return sum(share // CHUNK_PROMPTS * CHUNK_PROMPTS for share in shares.values())


@pytest.mark.parametrize("processes", [1, 3], ids=["one-process", "three-processes"])
def test_ctrl_c_during_enqueue_reports_what_was_enqueued_and_a_re_run_adds_only_the_rest(
    world: World, processes: int
) -> None:
    # Given an enqueue reading a pipe, which has stored every whole chunk written and waits for more
    pipe = world.tmp / "stream.jsonl"
    os.mkfifo(pipe)
    command = [sys.executable, "-m", "producer", "enqueue", str(pipe)]
    command += ["--run", RUN, "--output", str(world.tmp / "out"), "--batch-size", str(FIFO_BATCH_SIZE)]
    command += ["--processes", str(processes)]
    enqueued = whole_chunks(processes)
    assert enqueued > 0
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DRAFTGEN_")},
        "PYTHONPATH": str(REPOSITORY_ROOT),
        REDIS_URL_ENV: world.redis_url,
    }
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    keys = RunKeys(RUN)
    with pipe.open("w") as writer:
        writer.write("".join(json.dumps(row) + "\n" for row in rows(FIFO_ROWS_WRITTEN)))
        writer.flush()
        wait_until(
            lambda: (
                RunLedger(world.client, keys.run).counts().enqueued == enqueued
                and world.client.scard(keys.unpublished) == 0
            ),
            timeout_s=WAIT_S,
            what="the whole chunks to be enqueued and published",
        )
        time.sleep(0.2)  # it is blocked reading the next rows
        # When Ctrl-C reaches it, and every process it started (a terminal signals the whole group)
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=WAIT_S)
    # Then it exits 130 with the summary of what it enqueued, whole batches only, all published
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert f"new                 {enqueued} prompts in {enqueued // FIFO_BATCH_SIZE} batches" in stdout
    assert "interrupted" in stderr and "run the same command again to add the rest" in stderr
    assert RunLedger(world.client, keys.run).counts().enqueued == enqueued
    assert world.client.scard(keys.unpublished) == 0
    assert world.client.zcard(keys.open_batches) == enqueued // FIFO_BATCH_SIZE
    assert world.client.exists(keys.enqueue_lock) == 0  # the next enqueue need not wait
    # And running it again on the whole input adds only the rest
    (world.tmp / "all.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows(ALL_ROWS)))
    again = main(["enqueue", str(world.tmp / "all.jsonl"), "--run", RUN])
    assert again == EXIT_OK
    assert RunLedger(world.client, keys.run).counts().enqueued == ALL_ROWS
    batched = Counter(
        prompt.id
        for key in world.client.scan_iter(f"{keys.batches_prefix}*")
        for prompt in decode_blob(world.client.get(key), PromptBatch, limit_bytes=RECORD_LIMIT_BYTES).prompts
    )
    assert batched == Counter(str(row["id"]) for row in rows(ALL_ROWS))  # each in one batch


def enqueue_folder(world: World, folder: Path) -> list[str]:
    return ["enqueue", str(folder), "--run", RUN, "--output", str(world.tmp / "out")]


def test_a_folder_file_without_the_id_column_among_files_with_it_is_warned_about_by_name(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = world.tmp / "mixed"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows(2)))
    (folder / "b.jsonl").write_text(json.dumps({"prompt": "a row of its own, no id"}) + "\n")
    assert main(enqueue_folder(world, folder)) == EXIT_OK
    said = capsys.readouterr().err
    assert "warning: b.jsonl (1 rows) gave no id column while the folder's other files did" in said
    assert "a.jsonl" not in said


def test_a_folder_whose_files_all_lack_ids_is_not_warned_about(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = world.tmp / "hashed"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (folder / name).write_text(json.dumps({"prompt": f"the row of {name}"}) + "\n")
    assert main(enqueue_folder(world, folder)) == EXIT_OK
    assert "gave no id column" not in capsys.readouterr().err
