"""One module per framework ``perseus-train`` runs.

Each exposes ``check(cfg)`` and ``run(cfg)`` and is named by :mod:`perseus.train.frameworks`.
"""
