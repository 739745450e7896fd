"""Tar shards (img2dataset's webdataset output) as an image source: naming, ids, damage, headers only."""

import io
import os
import tarfile

import pytest

from extract import shards
from extract.images import image_id, list_images
from extract.shards import ShardError, find_shards, image_ids, names_shards, read_shard, split_member_name
from tests.helpers.shards import write_tar



def sample(key, image=b"\xff\xd8image", caption="a caption", image_extension="jpg"):
    members = [(f"{key}.{image_extension}", image)] if image is not None else []
    return members + [(f"{key}.txt", caption.encode()), (f"{key}.json", b'{"status": "success"}')]


def read_all(shard, root, extensions=None):
    damage = []
    samples = list(read_shard(shard, root, extensions, damage.append))
    return samples, damage


def test_ids_from_shards_equal_ids_of_img2dataset_files_output(tmp_path):
    keys = ["000000000", "000000001", "000010000"]
    for number, shard_keys in (("00000", keys[:2]), ("00001", keys[2:])):
        write_tar(tmp_path / "tars/part/{}.tar".format(number), [m for k in shard_keys for m in sample(k)])
        for key in shard_keys:
            folder = tmp_path / "files/part" / number
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{key}.jpg").write_bytes(b"x")
    file_ids = sorted(image_id(path, tmp_path / "files") for path in list_images(tmp_path / "files"))
    root, found = find_shards(tmp_path / "tars")
    shard_ids = [i for shard in found for i in image_ids(shard, root, pytest.fail)]
    assert shard_ids == file_ids == ["part/00000/000000000", "part/00000/000000001", "part/00001/000010000"]


def test_samples_group_consecutive_members_by_key(tmp_path):
    shard = write_tar(tmp_path / "00000.tar", sample("a") + sample("b", image=b"png!", image_extension="PNG")
                      + [("sub/c.seg.png", b"seg"), ("sub/c.txt", b"c")])
    samples, damage = read_all(shard, tmp_path, extensions=["jpg", "png", "txt"])
    assert damage == []
    assert [s.id for s in samples] == ["00000/a", "00000/b", "00000/sub/c"]
    assert samples[0].members == {"jpg": b"\xff\xd8image", "txt": b"a caption"}
    assert samples[1].members == {"png": b"png!", "txt": b"a caption"} and samples[1].image_extension == "png"
    # webdataset's KEY ends at the first dot of the base name: "seg.png" is not an image extension
    assert samples[2].extensions == ("seg.png", "txt") and samples[2].image_extension is None
    assert all(s.shard == shard for s in samples)
    assert split_member_name("a.b/c.d.JPG") == ("a.b/c", "d.jpg") and split_member_name("noext") is None


def test_find_shards_folder_glob_brace_and_file(tmp_path):
    for number in range(3):
        write_tar(tmp_path / f"r/{number:05d}.tar", sample(f"{number}"))
    (tmp_path / "r/00000.parquet").write_bytes(b"not a shard")
    write_tar(tmp_path / "r/deeper/00000.tar", sample("d"))
    expected = [tmp_path / f"r/{n:05d}.tar" for n in range(3)]
    assert find_shards(tmp_path / "r") == (tmp_path / "r", expected + [tmp_path / "r/deeper/00000.tar"])
    assert find_shards(f"{tmp_path}/r/*.tar") == (tmp_path / "r", expected)
    assert find_shards(f"{tmp_path}/r/*") == (tmp_path / "r", expected)  # the parquet files are no shards
    assert find_shards(f"{tmp_path}/r/{{00000..00001}}.tar") == (tmp_path / "r", expected[:2])
    assert find_shards(f"{tmp_path}/r/{{00002,00000}}.tar") == (tmp_path / "r", [expected[0], expected[2]])
    assert find_shards(f"{tmp_path}/r/000{{00..01}}.tar") == (tmp_path / "r", expected[:2])
    assert find_shards(tmp_path / "r/00001.tar") == (tmp_path / "r", [expected[1]])
    with pytest.raises(ShardError, match=r"1 of the shards it names do not exist \(e\.g\. .*00003\.tar\)"):
        find_shards(f"{tmp_path}/r/{{00000..00003}}.tar")
    with pytest.raises(ShardError, match=r"names no \.tar shard"):
        find_shards(f"{tmp_path}/r/*.tgz")
    # a range of a billion names is refused before a list of them is built (it took 1.3 GB)
    with pytest.raises(ShardError, match=r"names more than 1,000,000 shards; a shard pattern may name at most"):
        find_shards(f"{tmp_path}/r/{{000000000..999999999}}.tar")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ShardError, match="empty: names no"):
        find_shards(tmp_path / "empty")


def test_names_shards(tmp_path):
    write_tar(tmp_path / "tars/00000.tar", sample("a"))
    (tmp_path / "files/00000").mkdir(parents=True)
    (tmp_path / "files/00000/a.jpg").write_bytes(b"x")
    write_tar(tmp_path / "files/extra.tar", sample("b"))
    assert names_shards(tmp_path / "tars") and names_shards(tmp_path / "tars/00000.tar")
    assert names_shards(f"{tmp_path}/tars/{{00000..00009}}.tar") and names_shards(f"{tmp_path}/tars/*.tar")
    assert not names_shards(tmp_path / "files")  # image files win over a tar beside them
    assert not names_shards(tmp_path / "files/00000") and not names_shards(f"{tmp_path}/files/*")


def test_truncated_member_ends_the_shard_after_the_last_whole_sample(tmp_path):
    shard = write_tar(tmp_path / "00000.tar", sample("a") + sample("b", image=b"\xff" * 5000) + sample("c"))
    with tarfile.open(shard) as archive:
        cut = archive.getmember("b.jpg").offset_data + 1000
    os.truncate(shard, cut)
    samples, damage = read_all(shard, tmp_path)
    assert [s.id for s in samples] == ["00000/a"]
    assert len(damage) == 1 and "00000.tar: truncated in member b.jpg (1000 of 5000 bytes)" in damage[0]


def test_shard_cut_at_a_member_boundary_leaves_out_its_last_sample(tmp_path):
    shard = write_tar(tmp_path / "00000.tar", sample("a") + sample("b"), end=False)
    samples, damage = read_all(shard, tmp_path)
    assert [s.id for s in samples] == ["00000/a"]
    assert len(damage) == 1 and "without tar's end-of-archive block" in damage[0] and "00000/b" in damage[0]


def test_garbage_header_ends_the_shard_and_is_named(tmp_path):
    shard = write_tar(tmp_path / "00000.tar", sample("a") + sample("b"))
    with tarfile.open(shard) as archive:
        header = archive.getmember("b.jpg").offset
    with open(shard, "r+b") as handle:
        handle.seek(header)
        handle.write(b"garbage!" * 64)
    samples, damage = read_all(shard, tmp_path)
    assert [s.id for s in samples] == []  # a's last member may follow the damage: a is not known whole
    assert len(damage) == 1 and f"unreadable tar header at byte {header}" in damage[0]


def test_unreadable_members_are_named_and_skipped_and_the_rest_is_read(tmp_path):
    shard = write_tar(tmp_path / "00000.tar", sample("a") + [("b.jpg", (tarfile.SYMTYPE,)), ("b.txt", b"b")]
                      + [("../escape.jpg", b"x"), ("README", b"x")] + sample("c") + [("a.jpg", b"again")]
                      + sample("d") + [("d.txt", b"twice")])
    samples, damage = read_all(shard, tmp_path)
    assert [s.id for s in samples] == ["00000/a", "00000/b", "00000/c", "00000/d"]
    assert samples[1].image_extension is None and samples[1].members == {"txt": b"b"}
    assert samples[3].members["txt"] == b"a caption"
    assert [message.split(": ", 1)[1] for message in damage] == [
        "member b.jpg is not a regular file (tar type b'2'); skipped",
        "member ../escape.jpg would make the id 00000/'../escape', which has a '..' component; skipped",
        "member README has no extension, so belongs to no sample; skipped",
        "member a.jpg belongs to sample a, met again after other samples (a sample's members must be "
        "consecutive); skipped",
        "member d.txt repeats extension txt in sample d; skipped",
    ]
    assert all(message.startswith(f"{shard}: ") for message in damage)


def test_member_whose_data_cannot_be_read_is_left_out_of_its_sample(tmp_path, monkeypatch):
    shard = write_tar(tmp_path / "00000.tar", sample("a") + sample("b"))
    with tarfile.open(shard) as archive:
        bad = archive.getmember("a.jpg").offset_data

    class FailingAtA(io.FileIO):  # a disk error under a.jpg's data
        def read(self, size=-1):
            if self.tell() == bad:
                raise OSError(5, "Input/output error")
            return super().read(size)

    monkeypatch.setattr(shards, "open", lambda path, mode: FailingAtA(path, mode), raising=False)
    samples, damage = read_all(shard, tmp_path)
    assert [s.id for s in samples] == ["00000/a", "00000/b"]
    assert samples[0].unreadable == ("a.jpg",) and "jpg" not in samples[0].members
    assert samples[0].extensions == ("jpg", "txt", "json") and samples[1].members["jpg"] == b"\xff\xd8image"
    assert damage == [f"{shard}: member a.jpg cannot be read ([Errno 5] Input/output error); skipped"]


def test_sample_without_image_is_yielded_but_has_no_image_id(tmp_path):
    shard = write_tar(tmp_path / "00000.tar", sample("a") + sample("b", image=None) + sample("c"))
    samples, damage = read_all(shard, tmp_path)
    assert [s.id for s in samples] == ["00000/a", "00000/b", "00000/c"] and damage == []
    assert list(image_ids(shard, tmp_path, pytest.fail)) == ["00000/a", "00000/c"]


def test_not_a_tar_and_empty_shards(tmp_path):
    (tmp_path / "00000.tar").write_bytes(b"\x01" * 2000)
    samples, damage = read_all(tmp_path / "00000.tar", tmp_path)
    assert samples == [] and len(damage) == 1 and "00000.tar: not a readable tar file" in damage[0]
    empty = write_tar(tmp_path / "00001.tar", [])
    assert read_all(empty, tmp_path) == ([], [])
    samples, damage = read_all(tmp_path / "missing.tar", tmp_path)
    assert samples == [] and "missing.tar: cannot be opened" in damage[0]


def test_listing_reads_headers_only(tmp_path, monkeypatch):
    big = 200_000
    shard = write_tar(tmp_path / "00000.tar", [m for k in "abcde" for m in sample(k, image=os.urandom(big))])
    read = []

    class Counting(io.FileIO):
        def read(self, size=-1):
            data = super().read(size)
            read.append(len(data))
            return data

        def readinto(self, buffer):
            count = super().readinto(buffer)
            read.append(count)
            return count

    monkeypatch.setattr(shards, "open", lambda path, mode: Counting(path, mode), raising=False)
    assert list(image_ids(shard, tmp_path, pytest.fail)) == [f"00000/{k}" for k in "abcde"]
    assert 0 < sum(read) < big  # headers and captions' blocks, not one image's bytes
    read.clear()
    samples = list(read_shard(shard, tmp_path, ["txt"], pytest.fail))
    assert [s.members for s in samples] == [{"txt": b"a caption"}] * 5 and sum(read) < big
