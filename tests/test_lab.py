"""The JupyterLab side, for real: JupyterLab on loopback under a JupyterHub-style base URL, a traced evaluation
made by mlms_nb in a temporary MLMS_HOME, the REST API (auth, ids, paths, what it computes), and the sidebar and
timeline panel driven in Debian's Chromium (Playwright with ``executable_path``; screenshots under
tests/artifacts/lab/)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlms_nb.analyses import BOKEHJS_MARK, FIGURE_MARK
from tests.lab_support import (BASE_URL, CHROMIUM, SMALL_RUN, lab_during, launch_chromium, new_lab_page,
                               small_traced_run)

pytest.importorskip("jupyterlab", reason="JupyterLab is not installed (the jupyter extra)")
pytest.importorskip("torch", reason="the traced run needs PyTorch (the torch extra)")

ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "lab"
ENDPOINTS = ("runs", "runs/{e}", "runs/{e}/traces/torch", "runs/{e}/traces/torch/tiles?start_ns=0&end_ns=1000&width_px=100",
             "runs/{e}/traces/torch/summary?start_ns=0&end_ns=1000", "runs/{e}/traces/torch/search?q=conv",
             "runs/{e}/traces/torch/links?ref=0",
             "runs/{e}/traces/torch/counters?start_ns=0&end_ns=1000&width_px=100")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab started while a first traced run is made in the same MLMS_HOME (the two overlap)."""
    yield from lab_during(tmp_path_factory.mktemp("lab"), small_traced_run)


def get_json(lab, path):
    status, body = lab.get(f"mlms/api/{path}")
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def test_installed_extensions_are_enabled():
    """`pip install -e .` put the prebuilt lab extension and the server extension's config in place."""
    jupyter = [sys.executable, "-m", "jupyter"]
    commands = (["labextension", "list"], ["server", "extension", "list"])
    listing = [subprocess.Popen(jupyter + c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for c in commands]  # side by side: each starts a Python that imports Jupyter
    labext, server = (p.communicate(timeout=120)[0] for p in listing)
    line = next((ln for ln in labext.splitlines() if "mlms-nb-lab" in ln), "")
    assert "enabled" in line and "OK" in line, labext
    assert re.search(r"mlms_nb\s.*enabled", server) and re.search(r"mlms_nb .*OK", server), server


# ------------------------------------------------------------------------------------------ REST

def test_every_endpoint_needs_jupyters_auth(lab):
    server, ev = lab
    for path in ENDPOINTS:
        path = path.format(e=ev.id)
        assert server.get(f"mlms/api/{path}", token=None)[0] == 403, path
        assert server.get(f"mlms/api/{path}", token="not-the-token")[0] == 403, path
        assert server.get(f"mlms/api/{path}")[0] == 200, path
    # only under the base URL
    root = server.url[: -len(BASE_URL)]
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(f"{root}/mlms/api/runs",
                                                      headers={"Authorization": f"token {server.token}"}))
    assert err.value.code == 404


def test_ids_and_paths_cannot_leave_the_store(lab):
    server, ev = lab
    for bad in ("..", "%2e%2e", "%2Fetc%2Fpasswd", "..%2F..%2Fetc", "/etc/passwd".replace("/", "%2F"), "ABC",
                ev.id + "%2F..", ev.id[:-1] + "g"):
        status, body = server.get(f"mlms/api/runs/{bad}")
        assert status in (400, 404), (bad, status)
        status, body = server.get(f"mlms/api/runs/{bad}/traces/torch/tiles?start_ns=0&end_ns=10&width_px=10")
        assert status in (400, 404) and b"message" in body, (bad, status, body)
    for fw in ("..", "%2e%2e", "..%2F..%2Fhistory.sqlite", "%2Fetc", "Torch"):
        status, body = server.get(f"mlms/api/runs/{ev.id}/traces/{fw}/summary?start_ns=0&end_ns=10")
        assert status == 400 and b"not a framework name" in body, (fw, status, body)
    assert server.get(f"mlms/api/runs/{'0' * 32}")[0] == 404
    assert server.get(f"mlms/api/runs/{ev.id}/traces/tensorflow")[0] == 404
    for query in ("start_ns=0&end_ns=x&width_px=10", "start_ns=10&end_ns=0&width_px=10", "start_ns=0&end_ns=10",
                  "start_ns=0&end_ns=10&width_px=1e9", "start_ns=nan&end_ns=10&width_px=10"):
        assert server.get(f"mlms/api/runs/{ev.id}/traces/torch/tiles?{query}")[0] == 400, query
    # a traces row pointing outside the store (a tampered database) is never followed
    from mlms_nb.store.history import HistoryStore

    outside = server.home.parent / "outside"
    (outside / "onnxruntime").mkdir(parents=True)
    (server.home / "traces" / ev.id / "onnxruntime").symlink_to(outside / "onnxruntime")
    for path in (str(outside / "onnxruntime"), str(server.home / "traces" / ev.id / "onnxruntime"), "/etc"):
        HistoryStore(f"sqlite:///{server.home / 'history.sqlite'}").add_trace(ev.id, "x", "parquet", path=path)
    assert server.get(f"mlms/api/runs/{ev.id}/traces/onnxruntime")[0] == 404
    run = get_json(server, f"runs/{ev.id}")
    assert [t["framework"] for t in run["traces"]] == ["torch"]


def test_runs_trace_tiles_and_tables_match_the_trace(lab):
    server, ev = lab
    listed = get_json(server, "runs")
    assert get_json(server, f"runs?since={listed['version']}") == {"version": listed["version"], "unchanged": True}
    run = next(r for r in listed["runs"] if r["evaluation_id"] == ev.id)
    assert run["model"] == "efficientnet_lite0" and run["frameworks"] == ["torch"] and run["batch_sizes"] == [1]
    assert run["complete"] and run["trace_levels"] == ["FRAMEWORK"]
    spans = ev.traces["torch"].spans
    assert run["traces"][0]["spans"] == len(spans)
    one = get_json(server, f"runs/{ev.id}")
    assert one["options"]["trace_level"] == "FRAMEWORK" and one["summary"][0]["framework"] == "torch"

    meta = get_json(server, f"runs/{ev.id}/traces/torch")
    origin = int(spans["start_ns"].min())
    assert meta["n_spans"] == len(spans) and meta["origin_ns"] == origin
    traced = spans[spans["level"] != "APPLICATION"]
    assert meta["focus_ns"] == [int(traced["start_ns"].min()) - origin, int(traced["end_ns"].max()) - origin]
    assert {t["level"] for t in meta["tracks"]} == {"APPLICATION", "MODEL", "FRAMEWORK"}
    # every span is in exactly one mark (itself or a merged block) at any width, and marks stay bounded
    extent = meta["extent_ns"]
    for width in (60, 400, 3000):
        tile = get_json(server, f"runs/{ev.id}/traces/torch/tiles?start_ns=0&end_ns={extent}&width_px={width}")
        assert sum(tile["n"]) == len(spans), width
        assert sum(tile["busy"]) == int(spans["duration_ns"].sum())
        assert tile["count"] <= len(meta["tracks"]) * width * 2 + len(spans) * 0
    # a narrow window at the traced pass: only what overlaps it, drawn span by span
    a, b = meta["focus_ns"][0], meta["focus_ns"][0] + 2_000_000
    tile = get_json(server, f"runs/{ev.id}/traces/torch/tiles?start_ns={a}&end_ns={b}&width_px=4000")
    rel_s, rel_e = spans["start_ns"] - origin, spans["end_ns"] - origin
    assert sum(tile["n"]) == int(((rel_e >= a) & (rel_s <= b)).sum())

    # brushed range: count, total and self time per name, as pandas computes them from the trace
    summary = get_json(server, f"runs/{ev.id}/traces/torch/summary?start_ns={meta['focus_ns'][0]}"
                               f"&end_ns={meta['focus_ns'][1]}")
    inside = spans[(rel_s >= meta["focus_ns"][0]) & (rel_s <= meta["focus_ns"][1])]
    want = inside.groupby("name", observed=True)["duration_ns"].agg(["size", "sum"])
    assert summary["spans"] == len(inside)
    for row in summary["rows"]:
        assert (row["count"], row["total_ns"]) == tuple(int(v) for v in want.loc[row["name"]]), row
    top = summary["rows"][0]
    kids = spans[spans["parent_id"].isin(inside.loc[inside["name"] == top["name"], "span_id"])]
    assert top["self_ns"] == int(want.loc[top["name"], "sum"]) - int(kids["duration_ns"].sum())

    found = get_json(server, f"runs/{ev.id}/traces/torch/search?q=CONV")
    names = {n["name"] for n in found["names"]}
    assert names and all("conv" in n.lower() for n in names)
    assert found["matches"] == int(spans["name"].astype(str).str.lower().str.contains("conv").sum())

    layer = spans[(spans["kind"] == "layer") & (spans["parent_id"] != 0)].iloc[0]
    parent = spans.loc[spans["span_id"] == layer["parent_id"], "name"].iloc[0]
    by_name = {s["name"]: s for s in get_json(server, f"runs/{ev.id}/traces/torch/search?q={layer['name']}")["first"]}
    links = get_json(server, f"runs/{ev.id}/traces/torch/links?ref={by_name[layer['name']]['ref']}")
    assert any(r["relation"] == "parent" and r["name"] == parent for r in links["related"]), links
    assert server.get(f"mlms/api/runs/{ev.id}/traces/torch/links?ref={len(spans)}")[0] == 400

    counters = get_json(server, f"runs/{ev.id}/traces/torch/counters?start_ns=0&end_ns={extent}&width_px=200")
    assert counters["series"] == [] and "counter samples" in counters["note"]  # FRAMEWORK level samples none


def test_index_is_written_beside_the_trace_and_rebuilt_when_it_changes(lab, tmp_path):
    """The level-of-detail index lives beside the Parquet trace, keyed by the spans file; a re-saved trace gets a
    new one. Counters come back as min/max per pixel (real psutil samples)."""
    import os
    import shutil
    import time

    from mlms_nb.profilers.psutil_sampler import PsutilSampler
    from mlms_nb.server import lod
    from mlms_nb.tracing.trace import Trace

    server, ev = lab
    folder = server.home / "traces" / ev.id / "torch"
    assert (folder / lod.META_FILE).is_file() and (folder / lod.ROWS_FILE).is_file()
    copy = tmp_path / "trace"
    shutil.copytree(folder, copy)
    first = lod.open_index(copy)
    assert first.meta["n_spans"] == len(ev.traces["torch"].spans)
    sampler = PsutilSampler().start()
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        sum(i * i for i in range(20_000))
    counters = sampler.stop().counters_frame()
    Trace(ev.traces["torch"].spans.iloc[:50], counters, {"source": "test"}).save(copy)
    os.utime(copy / "spans.parquet", ns=(time.time_ns(), time.time_ns() + 1))
    second = lod.open_index(copy)
    assert second.meta["n_spans"] == 50 and second is not first
    t = counters["ts_ns"].to_numpy() - second.meta["origin_ns"]
    got = second.counters(int(t.min()), int(t.max()) + 1, 4)
    series = {s["label"]: s for s in got["series"]}
    assert any(s["unit"] == "%" for s in series.values()) and any(s["unit"] == "bytes" for s in series.values())
    for s in series.values():
        assert len(s["t_ns"]) <= 2 * 4 + 2
        assert all(lo <= hi for lo, hi in zip(s["min"], s["max"]) if lo is not None)


def test_one_damaged_trace_breaks_only_itself(lab):
    """A truncated spans.parquet, and a spans.parquet that links out of the store, mark that trace unreadable (with
    why) while the listing stays 200 and the run's other trace still opens (issue 23 item 5)."""
    import shutil

    from mlms_nb.store.history import HistoryStore

    server, ev = lab
    traces = server.home / "traces" / ev.id
    store = HistoryStore(f"sqlite:///{server.home / 'history.sqlite'}")
    damaged, linked = traces / "tensorflow", traces / "jax"
    outside = server.home.parent / "outside_spans.parquet"
    try:
        shutil.copytree(traces / "torch", damaged)
        spans = damaged / "spans.parquet"
        spans.write_bytes(spans.read_bytes()[:300])
        linked.mkdir()
        shutil.copyfile(traces / "torch" / "spans.parquet", outside)  # a valid trace, but outside MLMS_HOME
        (linked / "spans.parquet").symlink_to(outside)
        for folder in (damaged, linked):
            store.add_trace(ev.id, "x", "parquet", path=str(folder))

        listed = get_json(server, "runs")
        run = next(r for r in listed["runs"] if r["evaluation_id"] == ev.id)
        by_fw = {t["framework"]: t for t in run["traces"]}
        assert set(by_fw) == {"torch", "tensorflow", "jax"}
        assert "unreadable" not in by_fw["torch"] and by_fw["torch"]["spans"] == len(ev.traces["torch"].spans)
        assert "spans.parquet" in by_fw["tensorflow"]["unreadable"] and by_fw["tensorflow"]["spans"] == 0
        assert "link" in by_fw["jax"]["unreadable"] and by_fw["jax"]["spans"] == 0
        assert {t["framework"] for t in get_json(server, f"runs/{ev.id}")["traces"]} == set(by_fw)
        for fw in ("tensorflow", "jax"):
            for path in (f"runs/{ev.id}/traces/{fw}", f"runs/{ev.id}/traces/{fw}/summary?start_ns=0&end_ns=10"):
                status, body = server.get(f"mlms/api/{path}")
                message = json.loads(body)["message"]
                assert status == 422 and "unreadable" in message and "\n" not in message, (path, status, body)
        assert server.get(f"mlms/api/runs/{ev.id}/traces/torch")[0] == 200
    finally:
        for folder in (damaged, linked):
            shutil.rmtree(folder, ignore_errors=True)  # its row then points at nothing and is no longer listed
        outside.unlink(missing_ok=True)
    assert [t["framework"] for t in get_json(server, f"runs/{ev.id}")["traces"]] == ["torch"]


# ------------------------------------------------------------------------------------------ the browser

NOTEBOOK_CELLS = [
    "import mlms_nb\n"
    f"ev = mlms_nb.evaluate('efficientnet_lite0', **{SMALL_RUN!r})\nev",
    "ev.timeline()",
    "%load_ext mlms_nb\n%mlms timeline ev --panel",
]


def write_notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, path)


def run_all_cells(page, attempts: int = 3) -> None:
    """Run > Run All Cells, until the first cell's prompt shows it queued or ran (``[*]`` or ``[1]``): a click that
    lands while the menu or the kernel is still coming up is lost without a trace, so it is made again."""
    started = "(() => { const p = document.querySelector('.jp-Notebook .jp-Cell .jp-InputPrompt');" \
              " return !!p && /\\[(\\*|\\d+)\\]/.test(p.textContent); })()"
    for attempt in range(attempts):
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.keyboard.press("Escape")
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            page.wait_for_function(started, timeout=30_000)
            return
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: try the menu again
            if attempt == attempts - 1:
                raise


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def wait_idle(page, widget: int, timeout_ms: int = 30_000) -> None:
    page.wait_for_function(f"(window.mlmsTimelines || [])[{widget}]?.node.dataset.state === 'idle'",
                           timeout=timeout_ms)


@pytest.mark.slow  # ~40 s: JupyterLab, a kernel that imports torch and evaluates, and Chromium, end to end
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it as root "
                                             "with apt-get; without root or apt there is no browser to drive)")
def test_sidebar_and_timeline_in_chromium(lab):
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    server, first = lab
    write_notebook(server.root / "run.ipynb")
    with playwright.sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = new_lab_page(browser, 1500, 950)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{server.url}lab/tree/run.ipynb?token={server.token}", timeout=60_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            page.locator(".jp-mod-left li[data-id='mlms-runs']").click()  # the runs sidebar
            page.wait_for_selector(".mlms-run", timeout=30_000)
            stored = {r["evaluation_id"] for r in get_json(server, "runs")["runs"]}  # the fixture's, and any other
            assert page.locator(".mlms-run").count() == len(stored)                  # test's on this worker
            shot(page, "01_sidebar_one_run")

            run_all_cells(page)
            # the cell's evaluation lands in the store; the sidebar shows it within a poll
            page.wait_for_function(f"document.querySelectorAll('.mlms-run').length === {len(stored) + 1}",
                                   timeout=300_000)
            new_id = page.locator(".mlms-run").first.get_attribute("data-evaluation-id")
            assert new_id not in stored
            # %mlms timeline ev --panel opened it through the comm
            page.wait_for_function("(window.mlmsTimelines || []).length >= 1", timeout=60_000)
            wait_idle(page, 0)
            shot(page, "02_panel_opened_by_magic")

            # open it from the sidebar: a second panel, drawn from the tiles
            page.locator(f".mlms-run[data-evaluation-id='{new_id}'] .mlms-chip[data-framework='torch']").click()
            page.wait_for_function("(window.mlmsTimelines || []).length >= 2", timeout=30_000)
            wait_idle(page, 1)
            tl = "window.mlmsTimelines[1]"
            before = page.evaluate(f"{tl}.getView()")
            marks = page.evaluate(f"{tl}.visibleMarks()")
            assert marks and {m["band"] for m in marks} == {0}
            shot(page, "03_timeline")

            # zoom with the wheel around a layer: the view narrows, the tiles follow at a finer level
            layer = max((m for m in marks if m["n"] == 1), key=lambda m: m["w"])
            page.mouse.move(layer["x"], layer["y"])
            for _ in range(4):
                page.mouse.wheel(0, -400)
                page.wait_for_timeout(60)
            page.wait_for_function(f"{tl}.getView().x1 - {tl}.getView().x0 < {(before['x1'] - before['x0']) / 3}")
            wait_idle(page, 1)
            shot(page, "04_zoomed")

            # hover: the span under the cursor, with units
            target = max(page.evaluate(f"{tl}.visibleMarks()"), key=lambda m: m["w"])
            page.mouse.move(target["x"], target["y"])
            tip = page.locator(".mlms-tl-tooltip").nth(1)
            tip.wait_for(state="visible", timeout=10_000)
            text = tip.inner_text()
            assert re.search(r"(duration|block extent): [\d.]+ (s|ms|µs|ns)", text), text
            assert target["name"] in text
            shot(page, "05_hover")

            # click: its links (the layer's parent, its children)
            page.mouse.click(target["x"], target["y"])
            page.locator(".mlms-tl-links li").nth(0).wait_for(timeout=10_000)
            assert re.search(r"(parent|child|ancestor): ", page.locator(".mlms-tl-links").nth(0).inner_text())

            # brush (shift+drag) across the traced pass: count, total and self time per name
            page.locator(".mlms-tl-toolbar").nth(1).locator("button", has_text="Traced pass").click()
            wait_idle(page, 1)
            box = page.locator(".mlms-tl-canvas").nth(1).bounding_box()
            y = target["y"]
            page.keyboard.down("Shift")
            page.mouse.move(box["x"] + 250, y)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] * 0.8, y, steps=5)
            page.mouse.up()
            page.keyboard.up("Shift")
            table = page.locator(".mlms-tl-summary table").nth(0)
            table.wait_for(timeout=10_000)
            head = table.locator("th").all_inner_texts()
            assert head == ["name", "count", "total (ms)", "self (ms)"]
            assert table.locator("tr").count() > 1
            shot(page, "06_brushed")

            # search by name: matching spans stay, the rest fade
            page.locator(".mlms-tl-search").nth(1).fill("conv")
            page.wait_for_function(f"/[\\d,]+ matches/.test({tl}.node.querySelector('.mlms-tl-status').textContent)",
                                   timeout=10_000)

            # A/B: the first run stacked below, on the shared relative axis
            page.locator(f".mlms-run[data-evaluation-id='{first.id}'] .mlms-ab").click()
            page.wait_for_function(f"{tl}.bandCount() === 2", timeout=30_000)
            page.locator(".mlms-tl-search").nth(1).fill("")
            page.locator(".mlms-tl-toolbar").nth(1).locator("button", has_text="Traced pass").click()
            wait_idle(page, 1)
            assert {m["band"] for m in page.evaluate(f"{tl}.visibleMarks()")} == {0, 1}
            shot(page, "07_ab")

            # the Evaluation's HTML carries a link that opens the run
            page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="run.ipynb").click()
            link = page.locator("a[href^='#mlms-timeline/']").first
            link.scroll_into_view_if_needed()
            link.click()
            page.wait_for_function("(window.mlmsTimelines || []).length >= 3", timeout=30_000)

            # the in-cell figure renders; saved, the notebook carries BokehJS once; reopened, it renders again
            figure = ".jp-NotebookPanel-notebook .mlms-bokeh canvas"
            page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="run.ipynb").click()
            page.locator(figure).first.wait_for(state="attached", timeout=30_000)
            page.keyboard.press("Control+s")
            page.wait_for_function("!document.querySelector('.jp-mod-dirty')", timeout=20_000)
            outputs = [o for c in json.loads((server.root / "run.ipynb").read_text())["cells"] for o in c["outputs"]]
            html = [o.get("data", {}).get("text/html", "") for o in outputs]
            html = ["".join(h) if isinstance(h, list) else h for h in html]
            assert sum(h.count(BOKEHJS_MARK) for h in html) == 1
            assert sum(FIGURE_MARK in h for h in html) == 1
            page.goto(f"{server.url}lab/tree/run.ipynb?token={server.token}", timeout=60_000)
            page.locator(figure).first.wait_for(state="attached", timeout=60_000)
            shot(page, "08_reopened_notebook")
            assert errors == [], errors
        finally:
            browser.close()


MAGIC_CELLS = [
    "%load_ext mlms_nb",
    "%mlms eval efficientnet_lite0 --framework torch --dataset synthetic:2 --batch-sizes 1 --warmup 1 "
    "--min-repeats 3 --min-time 6",
]
STATUS = ".jp-StatusBar-Item:has-text('ipykernel')"


@pytest.mark.slow  # ~60 s: a kernel evaluating for ~10 s in JupyterLab, driven by Chromium, then a fresh reopen
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_kernel_is_busy_while_the_magic_evaluates_and_the_summary_survives_a_reopen(lab):
    """The status bar says Busy while `%mlms eval` runs (its progress is HTML redrawn in place: no widget traffic
    that marks the kernel idle); saved, closed and reopened after the kernel is gone, the cell still shows the
    run's one-line summary and no "Error displaying widget"."""
    import nbformat

    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    server, _ = lab
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in MAGIC_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, server.root / "magic.ipynb")
    running = "(() => [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')].some(p => /\\[\\*\\]/.test(p.textContent)))()"
    with playwright.sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = new_lab_page(browser, 1200, 900)
            page.goto(f"{server.url}lab/tree/magic.ipynb?token={server.token}&reset", timeout=60_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            page.wait_for_function(f"!!document.querySelector(\"{STATUS.split(':')[0]}\")", timeout=30_000)
            run_all_cells(page)
            page.locator(".mlms-progress").first.wait_for(timeout=120_000)  # the timed work has started
            samples = []
            while page.evaluate(running) and len(samples) < 120:
                text = page.locator(STATUS).first.inner_text()
                if page.evaluate(running):
                    samples.append("Busy" in text)
                page.wait_for_timeout(500)
            shot(page, "09_magic_busy")
            assert len(samples) >= 3 and all(samples), samples
            page.wait_for_function("document.querySelector('.mlms-progress') && "
                                   "/full pass/.test(document.querySelector('.mlms-progress').textContent)",
                                   timeout=60_000)
            page.keyboard.press("Control+s")
            page.wait_for_function("!document.querySelector('.jp-mod-dirty')", timeout=20_000)
        finally:
            browser.close()
        shut_down_kernels(server)  # "the next day": no live kernel holds any widget or display state
        browser = launch_chromium(pw)
        try:
            page = new_lab_page(browser, 1200, 900)
            page.goto(f"{server.url}lab/tree/magic.ipynb?token={server.token}&reset", timeout=60_000)
            summary = page.locator(".jp-OutputArea .mlms-progress")
            summary.first.wait_for(timeout=60_000)
            assert "full pass" in summary.first.inner_text()
            assert page.locator("text=Error displaying widget").count() == 0
            shot(page, "10_magic_reopened")
        finally:
            browser.close()


def shut_down_kernels(server) -> None:
    import urllib.request

    for kernel in json.loads(server.get("api/kernels")[1]):
        req = urllib.request.Request(f"{server.url}api/kernels/{kernel['id']}", method="DELETE")
        req.add_header("Authorization", f"token {server.token}")
        urllib.request.urlopen(req, timeout=60).close()
