"""The coordination server: jobs, ranks, phases, schedules and measurements over HTTP.

:func:`perseus.server.process.start_local_server` starts one as a separate process;
:func:`perseus.server.app.create_app` builds the FastAPI application.
"""
