"""Flower seen in a real browser during a real run: both queues, batches for their whole life on the GPU
that holds them, and each GPU's output rates beside `producer status`'s.

A run on two slow simulated GPUs (a generate worker each, plus the uploader) keeps the queues busy
for about half a minute; Flower watches it, and headless Chromium loads its pages. The pages are read
from the DOM Chromium rendered (after Flower's scripts ran), and Flower's API cross-checks them. With
DOC_SCREENSHOTS=<folder>, the pages' screenshots are kept there (docs/observability.md's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from devstack.local_stack import ManagedProcess, flower_process, free_port, http_ok, wait_until
from tests.support import prompt_files
from tests.support.stack import Stack, simulators
from workers.bootsteps.heartbeat_step import STATS_PREFIX
from workers.state.heartbeats import HEARTBEAT_TTL_S
from workers.state.queues import FLUSH_TASK, GENERATE_QUEUE, GENERATE_TASK, UPLOAD_QUEUE

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
JS_BUDGET_MS = 5000  # virtual time for Flower's scripts to fetch and draw their tables
WINDOW_SIZE = "1400,900"
CHROMIUM_TIMEOUT_S = 60
# slow GPUs: 1,440 prompts take about 90 s on two of them, three times the ~27 s the checks below take
# on an idle machine (in which the run must still be going on: batches waiting in `generate`)
SPEEDUP = 10.0
PROMPTS = 1_440
BATCH_SIZE = 8  # small batches: each worker finishes its first within seconds, and many wait queued
RUN = "flower-browser"
FLOWER_START_TIMEOUT_S = 30
WORK_DONE_TIMEOUT_S = 40
API_TIMEOUT_S = 10
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIN_SCREENSHOT_BYTES = 10_000
SCREENSHOTS_VARIABLE = "DOC_SCREENSHOTS"
# A batch of 8 requests of ~2,000 tokens at 10 × a GPU's speed lives seconds; its message is acknowledged in
# milliseconds, which is what Flower showed before batches told their life.
LEAST_BATCH_LIFE_S = 1.0
HTTP_OK = 200
RATE_AGREEMENT = 0.10  # the worker's count and status's are a second apart over a window of half a minute


def chromium_or_skip() -> str:
    path = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if path is None:
        message = "Debian's chromium package is not installed (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must run the browser test")
        pytest.skip(message)
    return path


@dataclass
class Browser:
    executable: str
    profile: Path

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", *args],
            capture_output=True,
            text=True,
            timeout=CHROMIUM_TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result

    def dom(self, url: str) -> str:
        """The page's DOM once its scripts have run."""
        return self._run(f"--virtual-time-budget={JS_BUDGET_MS}", "--dump-dom", url).stdout

    def screenshot(self, url: str, path: Path) -> Path:
        self._run(
            f"--virtual-time-budget={JS_BUDGET_MS}",
            "--run-all-compositor-stages-before-draw",  # a tab's fade-in ends before the picture
            f"--window-size={WINDOW_SIZE}",
            f"--screenshot={path}",
            url,
        )
        return path


@dataclass
class Table:
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


class Tables(HTMLParser):
    """Every table of a page: its header texts and the texts of its body rows' cells."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tables: list[Table] = []
        self._cell: list[str] | None = None
        self._in_body = False
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append(Table())
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body and self.tables:
            self.tables[-1].rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False
        elif tag in ("td", "th") and self._cell is not None and self.tables:
            text = " ".join("".join(self._cell).split())
            table = self.tables[-1]
            if tag == "th" and not self._in_body:
                table.headers.append(text)
            elif self._in_body and table.rows:
                table.rows[-1].append(text)
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def header(self, name: str) -> list[str]:
        """The first header row that has a column called `name` (DataTables repeats headers)."""
        return next(table.headers for table in self.tables if name in table.headers)

    def body_rows(self) -> list[list[str]]:
        return [row for table in self.tables for row in table.rows if row]


def flower_api(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=API_TIMEOUT_S) as response:
        return json.load(response)


@pytest.fixture
def running_stack(redis_url: str, log_dir: Path, tmp_path: Path) -> Iterator[Stack]:
    sims = simulators(2, speedup=SPEEDUP)
    stack = Stack(redis_url, log_dir, sims)
    try:
        yield stack.start()
    finally:
        stack.stop()
        for sim in sims:
            sim.stop()


@pytest.fixture
def flower(running_stack: Stack, log_dir: Path) -> Iterator[str]:
    port = free_port()
    # The API answers without a login only when told to, and draftgen's guard starts it so only with the
    # consent said too; Flower is bound to loopback here, on a machine of tests.
    env = running_stack.env(FLOWER_UNAUTHENTICATED_API="true", DRAFTGEN_FLOWER_OPEN_API="1")
    process: ManagedProcess = flower_process(port, env, log_dir).start()
    base = f"http://127.0.0.1:{port}"
    try:
        process.wait_ready(lambda: http_ok(f"{base}/healthcheck"), timeout_s=FLOWER_START_TIMEOUT_S)
        yield base
    finally:
        process.stop()


def worker_names(stack: Stack) -> dict[str, str]:
    """Celery node name prefix (`name@`) of each worker process, by role."""
    assert stack.uploader is not None
    return {
        **{f"generate gpu{gpu}": f"{worker.name}@" for gpu, worker in enumerate(stack.generators)},
        "upload": f"{stack.uploader.name}@",
    }


def succeeded_by_worker(base: str) -> dict[str, set[str]]:
    """Task names each worker has finished successfully, as Flower's events recorded them."""
    tasks = flower_api(base, "/api/tasks?state=SUCCESS")
    finished: dict[str, set[str]] = {}
    for task in tasks.values():
        finished.setdefault(str(task["worker"]), set()).add(str(task["name"]))
    return finished


def generate_tasks(base: str, state: str) -> list[dict[str, Any]]:
    tasks = flower_api(base, f"/api/tasks?state={state}&taskname={GENERATE_TASK}")
    return list(tasks.values())


def gpu_figures_in_flower(base: str) -> dict[str, dict[str, Any]]:
    """What each generate worker's page shows under "Other" (its `inspect stats`, `draftgen_<figure>`
    rows), by GPU label."""
    workers = flower_api(base, "/api/workers?refresh=1")
    figures = [
        {
            key.removeprefix(STATS_PREFIX): value
            for key, value in node["stats"].items()
            if key.startswith(STATS_PREFIX)
        }
        for node in workers.values()
        if "stats" in node
    ]
    return {figure["gpu"]: figure for figure in figures if figure}


def screenshots_folder(tmp_path: Path) -> Path:
    folder = Path(os.environ.get(SCREENSHOTS_VARIABLE) or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_flower_shows_both_queues_and_busy_workers_during_a_run(
    running_stack: Stack, flower: str, tmp_path: Path
) -> None:
    browser = Browser(chromium_or_skip(), tmp_path / "chromium-profile")
    shots = screenshots_folder(tmp_path)
    names = worker_names(running_stack)
    generator_prefixes = [prefix for role, prefix in names.items() if role != "upload"]
    # Given a run of 1,440 prompts in batches of 8 on two slow GPUs, watched by Flower
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(PROMPTS, "flower")]
    )
    running_stack.enqueue(data, RUN, "--output", str(tmp_path / "out"), "--batch-size", str(BATCH_SIZE))

    # When every worker has finished a task (a batch each GPU, a flush the uploader)
    def every_worker_finished_a_task() -> bool:
        finished = succeeded_by_worker(flower)
        return all(any(worker.startswith(prefix) for worker in finished) for prefix in names.values())

    wait_until(every_worker_finished_a_task, timeout_s=WORK_DONE_TIMEOUT_S, what="a finished task per worker")

    # Then the Tasks page lists batches in flight (started, not finished) on the GPUs that hold them
    wait_until(
        lambda: bool(generate_tasks(flower, "STARTED")), timeout_s=API_TIMEOUT_S, what="a batch in flight"
    )
    in_flight = Tables(browser.dom(f"{flower}/tasks?state=STARTED&name={GENERATE_TASK}"))
    columns = in_flight.header("State")
    rows = in_flight.body_rows()
    assert rows, "no batch in flight on the Tasks page"
    for row in rows:
        assert (row[columns.index("Name")], row[columns.index("State")]) == (GENERATE_TASK, "STARTED"), row
        assert any(row[columns.index("Worker")].startswith(prefix) for prefix in generator_prefixes), row
    browser.screenshot(f"{flower}/tasks?name={GENERATE_TASK}", shots / "flower-tasks.png")

    # And a finished batch's runtime is its whole life, its result its figures
    finished = generate_tasks(flower, "SUCCESS")
    assert all(task["runtime"] >= LEAST_BATCH_LIFE_S for task in finished), [t["runtime"] for t in finished]
    assert all("generated" in task["result"] for task in finished), finished[0]
    browser.screenshot(f"{flower}/tasks?state=SUCCESS&name={GENERATE_TASK}", shots / "flower-tasks-done.png")

    # And each GPU's page shows its output over the last minute, as `producer status` counts it
    shown = gpu_figures_in_flower(flower)
    status = json.loads(running_stack.producer("status", "--run", RUN, "--json").stdout)
    counted = {row["worker"]: row["output_tokens_per_s"] for row in status["gpus"]}
    assert set(shown) == set(counted), (shown, counted)
    flower_total = sum(figure["output_tokens_per_s"] for figure in shown.values())
    assert flower_total == pytest.approx(sum(counted.values()), rel=RATE_AGREEMENT), (shown, counted)
    assert all(
        figure["server_health"] == HTTP_OK and figure["suspended"] == "no" for figure in shown.values()
    )

    # Then the Broker page lists both queues, batches still waiting in `generate`: the run is going on
    broker = Tables(browser.dom(f"{flower}/broker"))
    columns = broker.header("Messages")
    depths = {row[0]: row[columns.index("Messages")] for row in broker.body_rows()}
    assert {GENERATE_QUEUE, UPLOAD_QUEUE} <= set(depths), depths
    assert int(depths[GENERATE_QUEUE]) > 0, depths
    assert depths[UPLOAD_QUEUE].isdigit(), depths

    # And the Tasks page, filtered to each task's successes, lists generate batches and flushes
    for task, role_prefixes in ((GENERATE_TASK, generator_prefixes), (FLUSH_TASK, [names["upload"]])):
        tasks = Tables(browser.dom(f"{flower}/tasks?state=SUCCESS&name={task}"))
        columns = tasks.header("State")
        rows = tasks.body_rows()
        assert rows, f"no successful {task} on the Tasks page"
        assert {(row[columns.index("Name")], row[columns.index("State")]) for row in rows} == {
            (task, "SUCCESS")
        }
        for row in rows:
            assert any(row[columns.index("Worker")].startswith(prefix) for prefix in role_prefixes), row

    # And the Workers page shows each worker online, with tasks processed and succeeded
    workers = Tables(browser.dom(f"{flower}/workers"))
    columns = workers.header("Processed")
    for role, prefix in names.items():
        (row,) = [row for row in workers.body_rows() if row[0].startswith(prefix)]
        assert row[columns.index("Status")] == "Online", (role, row)
        assert int(row[columns.index("Processed")]) > 0, (role, row)
        assert int(row[columns.index("Succeeded")]) > 0, (role, row)
        assert int(row[columns.index("Failed")]) == 0, (role, row)

    # And Flower's API agrees: both queues, every worker consuming its queue with tasks taken
    queues = {
        queue["name"]: queue["messages"]
        for queue in flower_api(flower, "/api/queues/length")["active_queues"]
    }
    assert {GENERATE_QUEUE, UPLOAD_QUEUE} <= set(queues), queues
    api_workers = flower_api(flower, "/api/workers?refresh=1")
    for role, prefix in names.items():
        (node,) = [node for node in api_workers if node.startswith(prefix)]
        consumed = {queue["name"] for queue in api_workers[node]["active_queues"]}
        task = FLUSH_TASK if role == "upload" else GENERATE_TASK
        assert consumed == {UPLOAD_QUEUE if role == "upload" else GENERATE_QUEUE}, (role, consumed)
        assert api_workers[node]["stats"]["total"].get(task, 0) > 0, (role, api_workers[node]["stats"])

    # And screenshots of the Workers, Broker and a GPU's worker page are saved
    gpu0 = next(node for node in api_workers if node.startswith(generator_prefixes[0]))
    for page, name in (("workers", "flower-workers.png"), ("broker", "flower-broker.png")):
        shot = browser.screenshot(f"{flower}/{page}", shots / name)
        assert shot.read_bytes().startswith(PNG_SIGNATURE)
        assert shot.stat().st_size > MIN_SCREENSHOT_BYTES
    gpu_page = browser.dom(f"{flower}/worker/{gpu0}")
    assert f"{STATS_PREFIX}output_tokens_per_s" in gpu_page  # its "Other" tab, a row a figure
    assert f"{STATS_PREFIX}completions_per_minute" in gpu_page
    browser.screenshot(f"{flower}/worker/{gpu0}#tab-other", shots / "flower-gpu-worker.png")


def test_a_worker_whose_server_went_down_shows_its_batches_handed_back_not_succeeding(
    running_stack: Stack, flower: str, tmp_path: Path
) -> None:
    # Given a run on two GPUs, watched by Flower, with batches in flight on both
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(PROMPTS, "down")]
    )
    running_stack.enqueue(data, RUN, "--output", str(tmp_path / "out"), "--batch-size", str(BATCH_SIZE))
    down_gpu, down_prefix = 1, f"{running_stack.generators[1].name}@"

    def held_on(prefix: str) -> bool:
        return any(task["worker"].startswith(prefix) for task in generate_tasks(flower, "STARTED"))

    wait_until(lambda: held_on(down_prefix), timeout_s=WORK_DONE_TIMEOUT_S, what="a batch on GPU 1")

    # When GPU 1's server goes down
    down_url = running_stack.sims[down_gpu].url
    running_stack.sims[down_gpu].stop()
    went_down_at = time.time()

    # Then its batches show as handed back, naming the server, on its worker
    def handed_back() -> list[dict[str, Any]]:
        return [t for t in generate_tasks(flower, "RETRY") if str(t["worker"]).startswith(down_prefix)]

    wait_until(lambda: bool(handed_back()), timeout_s=WORK_DONE_TIMEOUT_S, what="a batch handed back")
    assert all(down_url in str(task["exception"]) for task in handed_back()), handed_back()

    # And no batch of its succeeds after the server went down; the other GPU's still do
    def succeeded_after(prefix: str) -> list[dict[str, Any]]:
        return [
            task
            for task in generate_tasks(flower, "SUCCESS")
            if str(task["worker"]).startswith(prefix) and float(task["succeeded"]) > went_down_at + 1.0
        ]

    up_prefix = f"{running_stack.generators[0].name}@"
    wait_until(lambda: bool(succeeded_after(up_prefix)), timeout_s=WORK_DONE_TIMEOUT_S, what="GPU 0 going on")
    assert succeeded_after(down_prefix) == []

    # And its page says its server does not answer (from its next heartbeat's probe on)
    def server_shown_down() -> bool:
        figures = next(f for f in gpu_figures_in_flower(flower).values() if f["server"] == down_url)
        return bool(figures["server_health"] != HTTP_OK or figures["suspended"] != "no")

    wait_until(server_shown_down, timeout_s=HEARTBEAT_TTL_S, what="GPU 1's page to show its server down")
