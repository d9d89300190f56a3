"""What Perseus shows while a job runs: one live snapshot per job, and where it goes.

* :mod:`~perseus.observability.snapshot`: :class:`JobSnapshot`, the one picture of a job's live
  state (its phase and progress, each GPU's energy, power, clock and power limit, each arm's
  iteration time and energy, the predicted and measured saving with their 95 % intervals, an
  optimizer's choices). The coordination server builds one per job it holds
  (:mod:`perseus.server.live`); a job without a server builds its own.
* :mod:`~perseus.observability.prometheus`: the Prometheus metrics of any set of snapshots,
  rendered at scrape time (``/metrics``) or into a node_exporter textfile.
* :mod:`~perseus.observability.textfile`: the thread that writes a job's snapshot as a textfile
  (and as JSON, for a server's ``server.live_dir``) when the job has no server.
* ``grafana/perseus.json``: the Grafana dashboard over those metrics.

Everything here needs only the standard library, except the Prometheus rendering, which imports
``prometheus_client`` (the ``metrics`` extra) when it runs.
"""
