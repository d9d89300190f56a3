"""Start the ranks of a training job (torchrun's elastic agent) and the coordination server."""
