"""Helpers shared by test modules (fixtures stay in tests/conftest.py; the tests mirror the packages in
tests/extract/, tests/train/, tests/pipelines/ and tests/vlbert/, and what spans them sits in tests/):

    worlds.py           run configs over the tiny training world, and copies of it
    stores.py           synthetic FeatureStore records, damaged store files, record comparison
    store_damage.py     run as a process: damaged stores must give errors, never a signal
    shards.py           tar shards written member by member
    detection.py        random detector weights, detections and image folders
    models.py           VL-BERT configs, batches and saved model folders
    end2end.py          batches and checks for the end-to-end stage's visual side
    host_reads.py       the host's reads of tensor values (each a GPU sync) counted on the CPU
    kernel_families.py  tests run again in a child process under each lower CPU kernel family
    distributed_run.py  run under torchrun: one training run split across processes
    resumable_run.py    run under torchrun or python: a stage resumed from its latest checkpoint
    pipelines.py        the shipped pipeline files run on tiny published-format datasets
    slurm.py            a real two-node Slurm on this host (slurm-wlm, munge), started and stopped by pid
    browser.py          a page opened in headless Chromium, its requests and errors watched
"""
