"""The per-rank side of ``perseus-train``: build the model for the framework, run the loop."""
