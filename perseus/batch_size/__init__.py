"""batch_size."""
