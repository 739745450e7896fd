"""The variables of a pipeline step's environment that the project's own code reads: one name each, and
what it means. An executor (pipelines/executors/environment.py) sets them for the processes of a step
it starts; the code that reads them (training, progress, the step's process itself) names them from
here. They live on the ground floor because train/ and vlbert/ read them and cannot import pipelines/.

The executors also set variables of others: OMP_NUM_THREADS (the step's threads), CUDA_VISIBLE_DEVICES
(its GPUs, locally), PYTHONSAFEPATH (no user folder on its import path) and, on Slurm, torch's RANK,
WORLD_SIZE, MASTER_ADDR, ... (submitit's TorchDistributedEnvironment).
"""

# The cores that a step's processes are given, all ranks together (a whole number), where the executor
# leaves their affinity alone: the local executor shares a machine's cores among the steps it runs.
CORES = "VLBERT_CORES"
# The file in which rank 0 of a DDP job says where the ranks meet (host and port); the Slurm executor names it.
RENDEZVOUS = "VLBERT_RENDEZVOUS"
# "PID IDENTITY" of the local scheduler that started the step: its processes end when that process does.
SCHEDULER = "VLBERT_SCHEDULER"
# What the processes of one local launch of a step share, recorded in its step.json as its attempt.
ATTEMPT = "VLBERT_ATTEMPT"
# The file in which a step's progress bar publishes a snapshot, which `vlbert pipeline status` reads.
PROGRESS_FILE = "VLBERT_PROGRESS_FILE"
