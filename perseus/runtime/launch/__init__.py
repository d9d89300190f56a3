"""How the ranks of one launch find their coordination server.

The endpoint, the server rank 0 starts, the rendezvous through the job's store, and what Slurm says
about the job.
"""
