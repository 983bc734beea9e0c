"""A page of dasknn's own on the Dask dashboard: the boundary traffic of the last model- or hybrid-mode inference,
layer by layer and part to part, beside Dask's task stream and bandwidth pages.

After such a run the engine hands its figures to the scheduler (:func:`publish_traffic`); a scheduler plugin
(:data:`PLUGIN`, registered once per cluster) serves them at ``/dasknn/traffic`` (an HTML page: a bar a layer, a
table of bytes between parts) and ``/dasknn/traffic.json`` on the dashboard's own HTTP server (the address of
``client.dashboard_link``). A scheduler that cannot import dasknn gets no page; the run is not affected.
"""

from __future__ import annotations

import html
import json
import time

#: The plugin's name on the scheduler.
PLUGIN = "dasknn-traffic-page"
#: Where the figures are kept on the scheduler (``Client.set_metadata`` keys).
METADATA_KEYS = ("dasknn", "traffic")
#: The page's path, and its figures' as JSON, on the dashboard's HTTP server.
PAGE, JSON_PAGE = "/dasknn/traffic", "/dasknn/traffic.json"


def traffic_of(result) -> dict:
    """What the page shows of an :class:`~dasknn.engine.InferenceResult`: JSON-ready figures."""
    return {"mode": result.mode, "group_size": result.group_size, "exchange": result.exchange,
            "workers": result.workers, "layers": result.layers, "images": result.images,
            "seconds": round(result.seconds, 4), "bytes_sent": result.bytes_sent,
            "exchange_bytes": list(result.exchange_bytes), "dense_message_bytes": list(result.dense_message_bytes),
            "exchange_pairs": result.exchange_pairs, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}


def publish_traffic(client, result) -> None:
    """Give the scheduler ``result``'s traffic for the page (and add the page, once per cluster)."""
    try:
        client.register_plugin(_page_plugin()(), name=PLUGIN)
    except Exception:  # noqa: BLE001 - a scheduler without dasknn: no page, and nothing else changes
        return
    client.set_metadata(list(METADATA_KEYS), traffic_of(result))


def render(traffic: dict | None) -> str:
    """The page's HTML for the figures ``traffic`` (None: no run has published any yet)."""
    head = "<!doctype html><html><head><meta charset='utf-8'><title>dasknn traffic</title></head><body>"
    if not traffic:
        return head + "<h1>dasknn traffic</h1><p>No model- or hybrid-mode inference has run here yet.</p></body></html>"
    per_layer = traffic["exchange_bytes"]
    top = max(per_layer, default=0) or 1
    rows = "".join(
        f"<tr><td>{k}</td><td>{b:,}</td><td><div style='background:#3b7dd8;height:10px;width:{300 * b // top}px'>"
        f"</div></td></tr>" for k, b in enumerate(per_layer, start=1))
    pairs = traffic["exchange_pairs"]
    matrix = "".join("<tr><th>" + str(p) + "</th>" + "".join(f"<td>{b:,}</td>" for b in row) + "</tr>"
                     for p, row in enumerate(pairs))
    parts = "".join(f"<th>{q}</th>" for q in range(len(pairs)))
    what = html.escape(f"{traffic['mode']} mode, {traffic['group_size']} parts, exchange {traffic['exchange']}, "
                       f"{traffic['workers']} workers, {traffic['images']} images, {traffic['seconds']} s, "
                       f"{traffic['bytes_sent']:,} bytes sent; finished {traffic['finished']}")
    return (head + f"<h1>dasknn traffic</h1><p>{what}</p>"
            f"<h2>Boundary bytes a layer</h2><table><tr><th>layer</th><th>bytes</th><th></th></tr>{rows}</table>"
            f"<h2>Bytes from part (row) to part (column)</h2><table><tr><th></th>{parts}</tr>{matrix}</table>"
            "</body></html>")


def _page_plugin():
    # made here so importing dasknn imports neither distributed nor tornado
    from distributed.diagnostics.plugin import SchedulerPlugin
    from distributed.http.utils import RequestHandler

    def current(scheduler) -> dict | None:
        try:
            return scheduler.get_metadata(list(METADATA_KEYS))
        except KeyError:
            return None

    class Page(RequestHandler):
        def get(self) -> None:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.write(render(current(self.server)))

    class Figures(RequestHandler):
        def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(current(self.server)))

    class TrafficPage(SchedulerPlugin):
        """Adds :data:`PAGE` and :data:`JSON_PAGE` to the scheduler's HTTP server."""

        name = PLUGIN
        idempotent = True

        def start(self, scheduler) -> None:
            app = getattr(scheduler, "http_application", None)
            if app is not None:
                app.add_handlers(r".*$", [(PAGE, Page, {"dask_server": scheduler}),
                                          (JSON_PAGE, Figures, {"dask_server": scheduler})])

    return TrafficPage
