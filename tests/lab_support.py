"""Helpers for the JupyterLab tests and the lab benchmark: a real JupyterLab on loopback (random free port, a
token, a non-root base URL, its own MLMS_HOME), a small real traced evaluation, and Debian's Chromium."""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parents[1]
BASE_URL = "/hub/user/x/"
"""A JupyterHub-style base URL: every request of the extension must go under it."""
SMALL_RUN = dict(framework="torch", dataset="synthetic:2", batch_sizes=[1], trace_level="FRAMEWORK", warmup=1,
                 min_repeats=3, min_time_s=0.05, trace_repeats=2, progress=False)
"""A small traced evaluation: EfficientNet-Lite0, two synthetic images, batch size 1, a short timed loop."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    process: subprocess.Popen
    url: str          # http://127.0.0.1:PORT/hub/user/x/
    token: str
    root: Path        # the server's notebook folder
    home: Path        # its MLMS_HOME
    log: Path

    def api(self, path: str) -> str:
        return f"{self.url}mlms/api/{path}"

    def get(self, path: str, token: str | None = "") -> tuple[int, bytes]:
        """GET ``path`` under the base URL with the token (``token=None``: no credentials at all)."""
        req = urllib.request.Request(self.url + path)
        if token is not None:
            req.add_header("Authorization", f"token {token or self.token}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def stop(self) -> None:
        """SIGTERM, and after 5 s SIGKILL to the server and what it started (kernels). A server asked to stop while a
        kernel it just started is still importing has been seen to hang 20 s after shutting that kernel down, and a
        test has nothing left to read from it."""
        import psutil

        if self.process.poll() is None:
            try:
                children = psutil.Process(self.process.pid).children(recursive=True)
            except psutil.Error:
                children = []
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            for child in children:
                try:
                    child.kill()
                except psutil.Error:
                    pass


def checked_out_labextension(tmp: Path) -> Path:
    """A Jupyter data folder holding this checkout's prebuilt labextension/build as mlms-nb-lab: put first on
    JUPYTER_PATH, JupyterLab loads it rather than the copy `pip install -e .` made (which is only refreshed by a
    reinstall), so the browser tests drive the committed build."""
    data = tmp / "jupyter_data"
    target = data / "labextensions" / "mlms-nb-lab"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(REPO / "labextension" / "build", target)
    shutil.copy(REPO / "labextension" / "install.json", target / "install.json")
    return data


def start_lab(tmp: Path, home: Path, timeout_s: float = 90) -> Lab:
    """``jupyter lab`` on 127.0.0.1 under :data:`BASE_URL`, as installed (the mlms_nb server extension from the
    package's data files) but with this checkout's lab extension build (:func:`checked_out_labextension`),
    settings and runtime files under ``tmp``."""
    root = tmp / "notebooks"
    root.mkdir(parents=True, exist_ok=True)
    port, token = free_port(), secrets.token_hex(16)
    jupyter_path = os.pathsep.join(p for p in (str(checked_out_labextension(tmp)), os.environ.get("JUPYTER_PATH")) if p)
    env = dict(os.environ, JUPYTER_PATH=jupyter_path, MLMS_HOME=str(home), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"), PYTHONUNBUFFERED="1")
    quiet = tmp / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    quiet.parent.mkdir(parents=True, exist_ok=True)
    quiet.write_text('{"fetchNews": "false", "checkForUpdates": false}')  # no news toast over the screenshots
    log = tmp / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.base_url={BASE_URL}", f"--ServerApp.root_dir={root}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    lab = Lab(proc, f"http://127.0.0.1:{port}{BASE_URL}", token, root, home, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            if lab.get("api/status")[0] == 200:
                return lab
        except OSError:
            pass
        time.sleep(0.3)
    lab.stop()
    raise RuntimeError(f"jupyter lab did not answer within {timeout_s} s: {log.read_text()[-3000:]}")


def lab_during(tmp: Path, make_run):
    """JupyterLab started while ``make_run(home)`` makes a run in the same MLMS_HOME (the two overlap): a generator
    for a module fixture, yielding (the Lab, the run) and stopping the server after."""
    import threading

    home = tmp / "mlms_home"
    made = {}
    worker = threading.Thread(target=lambda: made.setdefault("ev", make_run(home)))
    worker.start()
    server = start_lab(tmp, home)
    worker.join()
    try:
        yield server, made["ev"]
    finally:
        server.stop()


def small_traced_run(home: Path):
    """A real traced evaluation stored in ``home`` (history row + Parquet trace)."""
    import mlms_nb

    old = os.environ.get("MLMS_HOME")
    os.environ["MLMS_HOME"] = str(home)
    try:
        return mlms_nb.evaluate("efficientnet_lite0", **SMALL_RUN)
    finally:
        if old is None:
            os.environ.pop("MLMS_HOME", None)
        else:
            os.environ["MLMS_HOME"] = old


def launch_chromium(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)


def new_lab_page(browser, width: int, height: int):
    """A page on which a JupyterLab dialog is answered with its default button, as a user would, and printed (a
    failing test's output shows it). On a loaded machine JupyterLab itself can open one over the notebook ("Select
    Kernel", "Kernel Restarting", "Server Connection Error"), which otherwise takes every later click. mlms-nb's
    lab extension opens no dialog unasked."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = browser.new_page(viewport={"width": width, "height": height})

    def answer(dialog) -> None:
        print("JupyterLab opened a dialog, answered with its default button:",
              " | ".join(line.strip() for line in dialog.inner_text().splitlines() if line.strip()))
        # a "Select Kernel" dialog opened while the kernel specs still load ignores its first click: asked again
        for _ in range(10):
            try:
                dialog.locator(".jp-Dialog-button.jp-mod-accept").first.click(timeout=5_000)
                dialog.wait_for(state="hidden", timeout=2_000)
                return
            except PlaywrightTimeout:
                continue

    page.add_locator_handler(page.locator(".jp-Dialog"), answer)
    return page
