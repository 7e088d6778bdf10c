"""`python -m producer report`, once its options are parsed: read the committed objects, draw, write.

Apart from the parser (producer/report/parser.py) so that other commands do not import numpy and pyarrow."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import redis

from core.exit_codes import EXIT_OK
from producer.errors import RunNotFound, SettingsError
from producer.progress_lines import ProgressLines
from producer.report.figures import compute_figures, dead_letters_by_reason
from producer.report.parser import DEFAULT_REPORTS_DIR
from producer.run_access import pinned_settings
from producer.settings import ProducerSettings
from workers.errors import UnsupportedStoreUrl
from workers.record.storage import check_output_folder, normalise_output, open_store
from workers.state.keys import check_run_name
from workers.state.redis_client import client_for

REDIS_CONNECT_TIMEOUT_S = 5.0
REDIS_SOCKET_TIMEOUT_S = 30.0


def _run_in_redis(client: redis.Redis, run: str) -> tuple[str | None, dict[str, int] | None]:
    """The run's pinned output URL and dead letters by reason; (None, None) when Redis does not know it."""
    pinned = pinned_settings(client, run)
    if pinned is None:
        return None, None
    return pinned.output, dead_letters_by_reason(client, run)


def cmd_report(args: argparse.Namespace, settings: ProducerSettings) -> int:
    from producer.report.render import summary_rows, write_report  # matplotlib only for this command

    run = check_run_name(args.run)
    client = client_for(
        args.redis_url or settings.redis_url,
        socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
        socket_timeout=REDIS_SOCKET_TIMEOUT_S,
    )
    try:
        pinned_url, dead_letters = _run_in_redis(client, run)
    except redis.RedisError as error:
        if args.output is None:
            raise RunNotFound(f"cannot read run {run!r} from Redis ({error}): pass --output URL") from error
        pinned_url, dead_letters = None, None
    finally:
        client.close()
    if args.output is None and pinned_url is None:
        raise RunNotFound(f"no run named {run!r} in Redis: pass --output URL to report on an output directly")
    store_url = normalise_output(args.output) if args.output is not None else str(pinned_url)
    out_dir: Path = args.out or DEFAULT_REPORTS_DIR / run
    try:
        check_output_folder(normalise_output(str(out_dir)))
    except UnsupportedStoreUrl as error:
        raise SettingsError(f"--out: {error}") from error
    figures = compute_figures(
        open_store(store_url), run, dead_letters=dead_letters, on_object=ProgressLines("read objects").update
    )
    page = write_report(figures, out_dir, generated_at=time.time())
    print(f"run {run}: {store_url}")
    width = max(len(row.name) for row in summary_rows(figures))
    for row in summary_rows(figures):
        print(f"{row.name:<{width}}  {row.value}")
    print()
    print(figures.loss.render_text())
    verdict = figures.loss.verdict()
    if verdict.rows and not verdict.passed:
        print(verdict.describe())
    print(f"wrote {page} and its pictures in {out_dir}")
    return EXIT_OK
