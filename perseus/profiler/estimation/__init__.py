"""Time and energy of each (instruction, clock), from an energy counter's updates and the stamps.

The equations of the counter's intervals (:mod:`.attribution`), their fit (:mod:`.power_fit`), the
priors (:mod:`.smooth`), one GPU's estimator (:mod:`.estimate`, :mod:`.type_estimate`) and a whole
job's (:mod:`.job_estimates`).
"""
