"""One module per file format Perseus reads or writes (the contracts in ``docs/design.md``).

* :mod:`.profile_csv` — the profile table (``stage,instruction,frequency,time,energy``);
* :mod:`.plan_json` — frequency plans (``perseus-plan/1`` JSON, reference ``.py`` literals);
* :mod:`.trace_csv` — the runtime's per-instruction traces (``trace-rank{R}.csv``);
* :mod:`.plan_outputs` — what planning writes into a directory (``frontier.csv``,
  ``plans/<id>.json``, ``plan.json``, ``summary.json``) and reads back;
* :mod:`.atomic_file` — writing a file so that readers never see half of it.

Everything but :mod:`.plan_outputs` uses the standard library only (pandas, where offered, is
imported on use).
"""
