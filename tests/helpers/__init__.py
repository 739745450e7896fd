"""Helpers shared by test modules (fixtures stay in tests/conftest.py):

    worlds.py           run configs over the tiny training world, and copies of it
    stores.py           synthetic FeatureStore records, damaged store files, record comparison
    detection.py        random detector weights, detections and image folders
    models.py           VL-BERT configs and batches
    end2end.py          batches and checks for the end-to-end stage's visual side
    store_damage.py     run as a process: damaged stores must give errors, never a signal
    distributed_run.py  run under torchrun: one training run split across processes
    slurm.py            a real single-node Slurm (slurm-wlm, munge), started and stopped by pid
"""
