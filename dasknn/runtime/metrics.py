"""What crossed between workers: the workers' byte counters and the exchange-log scheduler plugin."""

from __future__ import annotations

#: The exchange log's name among the scheduler's plugins.
EXCHANGE_LOG = "dasknn-exchange"


def bytes_sent(dask_worker) -> int:
    """Bytes this worker has sent to others (run with ``client.run``)."""
    return int(dask_worker.transfer_outgoing_bytes_total)


def exchange_log(send_prefix: str = "send-l", step_prefix: str = "spmm-l"):
    """A scheduler plugin: the size Dask records for every boundary message, by run and layer.

    It counts outputs of ``{send_prefix}{k}-...`` tasks (layer ``k``) and of ``{step_prefix}{k}-...`` steps (their
    messages for layer ``k + 1``) that a task pinned to another worker depends on: the bytes that cross, layer by
    layer, as Dask measured them (``sizeof`` of the output on its worker). The run is a key's last ``-`` field.
    Made here so importing dasknn does not import distributed."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    class ExchangeLog(SchedulerPlugin):
        name = EXCHANGE_LOG

        def __init__(self, send: str, step: str) -> None:
            self.send, self.step = send, step
            self.runs: dict[str, dict[int, int]] = {}
            self.scheduler = None

        async def start(self, scheduler) -> None:
            self.scheduler = scheduler

        def transition(self, key, start, finish, *args, **kwargs) -> None:
            if finish != "memory" or not isinstance(key, str) or not key.startswith((self.send, self.step)):
                return
            ts = self.scheduler.tasks.get(key) if self.scheduler is not None else None
            if ts is None:
                return
            here = {ws.address for ws in ts.who_has or ()}
            if not any(dts.worker_restrictions and here.isdisjoint(dts.worker_restrictions) for dts in ts.dependents):
                return  # read on its own worker only
            layer = int(key.split("-")[1][1:]) + key.startswith(self.step)
            per_run = self.runs.setdefault(key.rsplit("-", 1)[1], {})
            per_run[layer] = per_run.get(layer, 0) + int(ts.nbytes)

    return ExchangeLog(send_prefix, step_prefix)


def exchange_log_installed(dask_scheduler) -> bool:
    """Whether the scheduler has the exchange log (run with ``client.run_on_scheduler``)."""
    return EXCHANGE_LOG in dask_scheduler.plugins


def install_exchange_log(client) -> None:
    """Register the exchange log on ``client``'s scheduler unless it is there already."""
    if not client.run_on_scheduler(exchange_log_installed):
        client.register_plugin(exchange_log())


def exchange_log_pop(dask_scheduler, run: str) -> dict[int, int]:
    """The bytes logged for ``run``, by layer, forgotten by the log (run with ``client.run_on_scheduler``)."""
    plugin = dask_scheduler.plugins.get(EXCHANGE_LOG)
    return {} if plugin is None else plugin.runs.pop(run, {})
