"""The REST endpoints under ``{base_url}mlms/api/`` (JSON). Every handler is a jupyter_server ``APIHandler`` with
``@tornado.web.authenticated`` and ``@authorized``: without Jupyter's token or login cookie a request gets 403.

=================================================================  ================================================
``GET runs[?since=VERSION]``                                       the stored runs, newest first; ``version``
                                                                   changes when a run or trace lands (``since``:
                                                                   ``{"unchanged": true}`` while it has not)
``GET runs/<evaluation_id>``                                       one run: options, summary, its traces
``GET runs/<evaluation_id>/traces/<framework>``                    the trace's index: tracks, extent, focus (the
                                                                   traced pass), names, signatures
``GET .../tiles?start_ns=&end_ns=&width_px=``                      the marks to draw (see ``LodIndex.tiles``)
``GET .../summary?start_ns=&end_ns=``                              count, total and self time per name
``GET .../search?q=``                                              names containing ``q`` and where they are
``GET .../links?ref=``                                             a span's ancestors, children, correlated spans
``GET .../counters?start_ns=&end_ns=&width_px=``                   counter series, min/max per pixel
=================================================================  ================================================

Times are integer ns from the trace's first span. A malformed id or parameter gets 400, an unknown run 404, a trace
whose files cannot be read (damaged, or a link out of its folder) 422 with why, while the listing stays 200 and marks
that trace ``unreadable``; ids are checked before anything touches the store (see :mod:`mlms_nb.server.runs`).
"""
from __future__ import annotations

import asyncio
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import orjson
import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from mlms_nb.server import lod, runs

AUTH_RESOURCE = "mlms"
_pool = ThreadPoolExecutor(2, thread_name_prefix="mlms-api")
_warming: set[str] = set()
WARM_NEWEST = 5
"""Listing the runs builds the missing indexes of the newest traces this many, in the background."""
_warm_lock = threading.Lock()


def _warm(folders) -> None:
    """Build the level-of-detail index of traces that have none yet, one at a time, in the background: a run
    that just landed opens at once when its user clicks it."""
    for folder in folders:
        try:
            lod.open_index(folder)
        except Exception:  # noqa: BLE001 - a bad trace says so when it is opened; warming is best effort
            pass
        finally:
            with _warm_lock:
                _warming.discard(str(folder))


class MlmsHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    def reply(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))

    async def answer(self, work, *args) -> None:
        """Run ``work(*args)`` off the event loop; its errors become 400 / 404 replies with one sentence."""
        try:
            data = await asyncio.get_running_loop().run_in_executor(_pool, work, *args)
        except runs.BadRequest as err:
            return self.reply({"message": str(err)}, 400)
        except runs.NotFound as err:
            return self.reply({"message": str(err)}, 404)
        except runs.Unreadable as err:  # a damaged trace: this one only, said in one sentence
            return self.reply({"message": str(err)}, 422)
        self.reply(data)

    def int_arg(self, name: str, lo: int | None = None, hi: int | None = None, default=None) -> int:
        raw = self.get_query_argument(name, None)
        if raw is None:
            if default is None:
                raise runs.BadRequest(f"the query parameter {name} is missing")
            return default
        try:
            value = float(raw)
        except ValueError:
            raise runs.BadRequest(f"{name}={raw[:40]!r} is not a number") from None
        if not math.isfinite(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise runs.BadRequest(f"{name}={raw[:40]!r} is out of range ({lo}..{hi})")
        return int(value)

    def window(self) -> tuple[int, int]:
        start = self.int_arg("start_ns", -(2 ** 62), 2 ** 62)
        end = self.int_arg("end_ns", -(2 ** 62), 2 ** 62)
        if end <= start:
            raise runs.BadRequest(f"end_ns ({end}) must be after start_ns ({start})")
        return start, end


class RunsHandler(MlmsHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        since = self.get_query_argument("since", "")

        def work():
            version = runs.store_version()
            if since and since == version:  # what the sidebar polls: nothing landed since it last looked
                return {"version": version, "unchanged": True}
            cold = []
            for folder in runs.trace_folders()[:WARM_NEWEST]:
                if not (folder / lod.META_FILE).exists():
                    with _warm_lock:
                        if str(folder) not in _warming:
                            _warming.add(str(folder))
                            cold.append(folder)
            if cold:
                threading.Thread(target=_warm, args=(cold,), daemon=True, name="mlms-lod-warm").start()
            return {"runs": runs.list_runs(limit=500), "version": version, "store": runs.store_description()}

        await self.answer(work)


class RunHandler(MlmsHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, evaluation_id: str):
        await self.answer(runs.get_run, evaluation_id)


def _index(evaluation_id: str, framework: str) -> lod.LodIndex:
    return lod.open_index(runs.trace_folder(evaluation_id, framework))


class TraceHandler(MlmsHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, evaluation_id: str, framework: str):
        def work():
            index = _index(evaluation_id, framework)
            meta = {k: v for k, v in index.meta.items() if k not in ("group_offsets", "group_lookback_ns", "key")}
            return {"evaluation_id": evaluation_id, "framework": framework, **meta}

        await self.answer(work)


class TraceQueryHandler(MlmsHandler):
    """``tiles``, ``summary``, ``search``, ``links`` and ``counters`` of one trace."""

    @tornado.web.authenticated
    @authorized
    async def get(self, evaluation_id: str, framework: str, what: str):
        def work():
            runs.check_evaluation_id(evaluation_id)
            runs.check_framework(framework)
            if what == "tiles":
                start, end = self.window()
                return _index(evaluation_id, framework).tiles(start, end, self.int_arg("width_px", 10, 20000))
            if what == "counters":
                start, end = self.window()
                return _index(evaluation_id, framework).counters(start, end, self.int_arg("width_px", 10, 20000))
            if what == "summary":
                return _index(evaluation_id, framework).summary(*self.window())
            if what == "search":
                q = self.get_query_argument("q", "")
                if len(q) > 200:
                    raise runs.BadRequest("q is longer than 200 characters")
                return _index(evaluation_id, framework).search(q)
            return _index(evaluation_id, framework).links(self.int_arg("ref", 0, 2 ** 62))

        await self.answer(work)


def setup_handlers(web_app) -> None:
    base = url_path_join(web_app.settings["base_url"], "mlms", "api")
    seg = r"([^/]+)"
    web_app.add_handlers(".*$", [
        (url_path_join(base, "runs") + "/?", RunsHandler),
        (url_path_join(base, "runs", seg) + "/?", RunHandler),
        (url_path_join(base, "runs", seg, "traces", seg) + "/?", TraceHandler),
        (url_path_join(base, "runs", seg, "traces", seg, "(tiles|summary|search|links|counters)") + "/?",
         TraceQueryHandler),
    ])
