"""The test suite, mirroring the packages (tests/extract/, tests/train/, tests/pipelines/, tests/vlbert/;
what spans them in tests/). Test modules import shared helpers from tests.helpers; a few take a small
builder from the module that tests its subject (`from tests.train.test_captions import read_jsonl`)."""
