"""The live model of the server's jobs: what ``/metrics`` and the live page show, as they run.

* :mod:`~perseus.server.live.telemetry`: a job's bounded live readings, fed by the job under its
  lock with what it receives anyway;
* :mod:`~perseus.server.live.views`: a job's :class:`~perseus.observability.snapshot.JobSnapshot`
  and :class:`~perseus.observability.snapshot.JobDetail` from its view and telemetry;
* :mod:`~perseus.server.live.local`: the snapshots jobs without a server publish into
  ``server.live_dir``;
* :mod:`~perseus.server.live.routes`: ``GET /metrics``, the page's read-only JSON
  (``/live/...``) and the page itself (``/ui/``, static files in ``page/``).
"""
