"""A generate run's phases in the JupyterLab timeline panel (issue 21, item 5): the zoo's tiny GPT-2 decoder (random
weights from its config) generated at trace level FRAMEWORK in PyTorch (2 prompts, 4 new tokens, batch size 1), opened
from the runs sidebar in real JupyterLab driven by Debian's Chromium: the prefill and each decode step are drawn as
bands in their phase's colour, named on the strip and on hover (batch size, duration with its unit), and merged into
one block when zoomed out so far that the steps are narrower than a few pixels."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.lab_support import CHROMIUM, lab_during, launch_chromium, new_lab_page

pytest.importorskip("jupyterlab", reason="JupyterLab is not installed (the jupyter extra)")
pytest.importorskip("torch", reason="the generate run needs PyTorch (the torch extra)")

NEW_TOKENS = 4
RUN = dict(framework="torch", scenario="generate", dataset="synthetic:2", batch_sizes=1, max_new_tokens=NEW_TOKENS,
           trace_level="FRAMEWORK", warmup=1, min_repeats=2, min_time_s=0, threads=1, progress=False)
PHASE_RGB = {"prefill": (0x1F, 0x77, 0xB4), "decode": (0x94, 0x67, 0xBD)}  # analyses.phases.PHASE_COLOURS
ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "lab"  # beside tests/test_lab.py's screenshots
DURATION = re.compile(r"\d+(\.\d+)? (s|ms|µs|ns)")


def generate_run(home):
    import os

    import mlms_nb

    old = os.environ.get("MLMS_HOME")
    os.environ["MLMS_HOME"] = str(home)
    try:
        return mlms_nb.evaluate("tiny_gpt2", **RUN)
    finally:
        if old is None:
            os.environ.pop("MLMS_HOME", None)
        else:
            os.environ["MLMS_HOME"] = old


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab started while the traced generate run is made in the same MLMS_HOME."""
    yield from lab_during(tmp_path_factory.mktemp("lab_phases"), generate_run)


def pixel(page, tl: str, x: float, y: float) -> tuple[int, int, int]:
    """The canvas's colour at client point (x, y)."""
    return tuple(page.evaluate(
        f"""(() => {{ const c = {tl}.node.querySelector('canvas'); const r = c.getBoundingClientRect();
        const k = c.width / r.width;
        return Array.from(c.getContext('2d').getImageData(Math.round(({x} - r.left) * k),
                                                          Math.round(({y} - r.top) * k), 1, 1).data.slice(0, 3)); }})()"""))


def hover_text(page, x: float, y: float) -> str:
    page.mouse.move(x, y)
    tip = page.locator(".mlms-tl-tooltip").first
    tip.wait_for(state="visible", timeout=5_000)
    return tip.inner_text()


@pytest.mark.slow  # ~30 s: JupyterLab, a traced tiny generate run and Chromium, end to end
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it as root "
                                             "with apt-get; without root or apt there is no browser to drive)")
def test_panel_draws_and_names_a_generate_runs_phases(lab):
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    server, ev = lab
    status, body = server.get(f"mlms/api/runs/{ev.id}/traces/torch")
    assert status == 200, body[:300]
    sent = json.loads(body)["phases"]
    # one batch generated again under the tracer: its prefill, then one decode step per further new token
    assert [p["label"] for p in sent] == ["prefill"] + [f"decode step {k}" for k in range(1, NEW_TOKENS)], sent
    assert {p["batch_size"] for p in sent} == {1}
    with playwright.sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = new_lab_page(browser, 1400, 800)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{server.url}lab?token={server.token}", timeout=60_000)
            page.locator(".jp-mod-left li[data-id='mlms-runs']").click()  # the runs sidebar
            page.locator(f".mlms-run[data-evaluation-id='{ev.id}'] .mlms-chip[data-framework='torch']").click()
            page.wait_for_function("(window.mlmsTimelines || []).length >= 1", timeout=30_000)
            tl = "window.mlmsTimelines[0]"
            page.wait_for_function(f"{tl}.node.dataset.state === 'idle'", timeout=30_000)

            # the traced pass: every step its own band, in its phase's colour, named
            bands = page.evaluate(f"{tl}.visiblePhases()")
            assert [b["label"] for b in bands] == [p["label"] for p in sent], bands
            assert int(page.evaluate(f"{tl}.node.dataset.phases")) == len(sent)
            for b in bands[:2]:
                assert pixel(page, tl, b["x0"] + 1.5, b["y"] - 4) == PHASE_RGB[b["phase"]], b
            prefill = bands[0]
            text = hover_text(page, (prefill["x0"] + prefill["x1"]) / 2, prefill["y"])
            assert "prefill" in text and re.search(r"batch size:\s*1\b", text) and DURATION.search(text), text
            decode = next(b for b in bands if b["phase"] == "decode")
            text = hover_text(page, (decode["x0"] + decode["x1"]) / 2, decode["y"])
            assert decode["label"] in text and DURATION.search(text), text
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "10_generate_phases.png"))

            # zoomed far out: the decode steps, narrower than a few pixels, are one merged block (the prefill stays)
            page.evaluate(f"(() => {{ const v = {tl}.getView(); const w = v.x1 - v.x0; "
                          f"{tl}.setView(v.x0 - 2000 * w, v.x1 + 2000 * w); }})()")
            page.wait_for_function(f"{tl}.node.dataset.phases === '2'", timeout=10_000)
            far = page.evaluate(f"{tl}.visiblePhases()")
            assert [(b["phase"], b["n"]) for b in far] == [("prefill", 1), ("decode", len(sent) - 1)], far
            assert far[1]["label"] == f"decode steps 1–{len(sent) - 1}"
            assert not errors, errors
        finally:
            browser.close()
