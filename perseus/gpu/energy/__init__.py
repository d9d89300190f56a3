"""A GPU's energy, off the training thread.

The counter's sampler, energy between two instants, the probe of how the readings behave, and
energy from sampled power where no counter exists.
"""
