"""The layers of the zoo's model families, cut into pipeline-friendly sequences."""
