import pytest
import torch

from pipelines.world.tiny import build_tiny_world
from tests.helpers.slurm import running_slurm
from tests.helpers.worlds import copy_world

torch.set_num_threads(2)

TINY_WORLD_IMAGES = 12


@pytest.fixture(scope="session")
def tiny_detector():
    from extract import Detector

    return Detector.build("tiny")


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The tiny training world (world/, cache/, vocab/), built and extracted once per session.
    Read-only: a test or module that writes into it takes a copy (`tiny_world_copy`, `copy_world`)."""
    return build_tiny_world(tmp_path_factory.mktemp("tiny-world"), images=TINY_WORLD_IMAGES)


@pytest.fixture
def tiny_world_copy(tiny_world, tmp_path):
    """This test's own copy of the session's tiny world."""
    return copy_world(tiny_world, tmp_path / "tiny-world")


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running two-node Slurm (tests/helpers/slurm.py), with SLURM_CONF pointing at it while it
    runs. Skipped only where slurm-wlm and munge are missing and cannot be installed here."""
    with running_slurm() as cluster:
        yield cluster


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group marks into the test ids
def pytest_collection_modifyitems(config, items):
    """`cuda` tests are skipped where torch sees no CUDA device, so they can sit in every run. Under
    pytest-xdist (`make test` runs two workers), every test of a Slurm cluster runs in one worker, which
    starts the session's cluster once (`--dist loadgroup`)."""
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if skip is not None and item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
        if "slurm_cluster" in getattr(item, "fixturenames", ()) or item.path.name == "test_slurm_cluster.py":
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under `--dist loadgroup` a group reaches the scheduler as its tests' ids ending in `@GROUP`. Where
    they do not (pytest 9.2 with pytest-xdist 3.8: pytest-xdist#1386), each worker would start a Slurm
    cluster of its own, both on the same 2 cores: the run stops before any test runs."""
    slurm = [test for test in ids if test.startswith("tests/pipelines/test_slurm_cluster.py::")]
    if node.config.getoption("dist") == "loadgroup" and slurm and not all(t.endswith("@slurm") for t in slurm):
        import xdist

        raise pytest.UsageError(f"--dist loadgroup: the Slurm tests lost their group ({slurm[0]}): pytest-xdist "
                                f"{xdist.__version__} cannot group on pytest {pytest.__version__}; install the "
                                "versions of constraints.txt")
