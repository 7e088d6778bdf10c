"""A run's output folder is made only where a run belongs (not /var, /opt, /srv, a home folder or a hidden
one in it, unless meant), and written and read only inside itself: a symbolic link placed in it after
enqueue (a folder of parts pointed elsewhere, one object pointed at a file) is refused with its path, and
nothing is written where it points."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.errors import UnsafeKey, UnsupportedStoreUrl
from workers.record.output_places import check_fresh_place, shared_place_of
from workers.record.storage import FolderStore


def test_a_linked_folder_inside_the_output_is_refused_and_nothing_lands_where_it_points(
    tmp_path: Path,
) -> None:
    store = FolderStore(tmp_path / "out")
    store.put("run.json", b"{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out" / "data").symlink_to(elsewhere)

    with pytest.raises(UnsafeKey, match=r"out/data is a symbolic link \(to .*elsewhere\)"):
        store.put("data/part-000001.parquet", b"parquet")
    assert list(elsewhere.iterdir()) == []


def test_a_linked_object_is_neither_read_nor_replaced(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "out")
    secret = tmp_path / "secret"
    secret.write_text("not the run's")
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / "run.json").symlink_to(secret)

    with pytest.raises(UnsafeKey, match=r"run\.json is a symbolic link"):
        store.get("run.json")
    with pytest.raises(UnsafeKey, match=r"run\.json is a symbolic link"):
        store.put("run.json", b"{}")
    assert secret.read_text() == "not the run's"


def test_an_output_whose_root_became_a_link_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "out").symlink_to(target)
    with pytest.raises(UnsafeKey, match="out is a symbolic link"):
        FolderStore(tmp_path / "out").put("run.json", b"{}")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/root", "a home folder"),
        ("/home/ann", "a home folder"),
        ("/root/.ssh", "inside /root/.ssh, a hidden folder of the home /root"),
        ("/home/ann/.config/x", "inside /home/ann/.config, a hidden folder of the home /home/ann"),
        ("/var/lib/x", "under /var"),
        ("/opt/x", "under /opt"),
        ("/srv", "under /srv"),
        ("/root/draftgen/output/run-1", None),  # a project folder in a home is where users work
        ("/home/ann/data/runs", None),
        ("/data/runs/x", None),
    ],
)
def test_shared_places_are_named_and_a_project_folder_in_a_home_is_not_one(
    path: str, why: str | None
) -> None:
    assert shared_place_of(Path(path)) == why


def test_allow_location_lets_a_shared_place_be_used_when_meant() -> None:
    with pytest.raises(UnsupportedStoreUrl, match="--allow-location"):
        check_fresh_place(Path("/srv/draftgen-runs"), ours=("run.json",), allow_shared=False)
    check_fresh_place(Path("/srv/draftgen-runs"), ours=("run.json",), allow_shared=True)
