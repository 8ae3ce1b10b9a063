import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import millrace
from millrace.dataset import ShardDataset


def _make_safetensors(d, counts):
    """Shards whose sample i of shard s has x = [s, i, s*1000+i] and y = s*1000+i."""
    paths = []
    for s, n in enumerate(counts):
        ids = np.arange(n, dtype=np.int64) + s * 1000
        x = np.stack([np.full(n, s), np.arange(n), ids], axis=1).astype(np.float32)
        p = os.path.join(d, f"train-{s:03d}.safetensors")
        millrace.save_checkpoint({"x": x, "y": ids}, p)
        paths.append(p)
    return paths


def _ids(batch):
    return batch["y"].tolist()


def test_batches_hold_the_right_samples(tmp_path):
    _make_safetensors(str(tmp_path), [50, 70, 30])
    ds = ShardDataset(
        str(tmp_path / "train-*.safetensors"),
        batch_size=16,
        shuffle=True,
        seed=3,
        prefetch=2,
        mix_shards=2,
    )
    assert ds.num_samples == 150 and len(ds) == 10
    seen = []
    for b in ds:
        assert b["x"].shape[1:] == (3,) and b["x"].dtype == np.float32
        # every row is internally consistent: x holds the shard, index and id of the same sample
        assert np.array_equal(b["x"][:, 2].astype(np.int64), b["y"])
        assert np.array_equal(b["x"][:, 0] * 1000 + b["x"][:, 1], b["x"][:, 2])
        seen += _ids(b)
    assert sorted(seen) == sorted(
        list(range(50)) + list(range(1000, 1070)) + list(range(2000, 2030))
    )
    assert seen != sorted(seen), "shuffle=True returned the samples in file order"


def test_no_shuffle_is_file_order_and_drop_last(tmp_path):
    _make_safetensors(str(tmp_path), [10, 10])
    ds = ShardDataset(str(tmp_path / "*.safetensors"), batch_size=6, drop_last=True)
    got = [_ids(b) for b in ds]
    assert got == [
        [0, 1, 2, 3, 4, 5],
        [6, 7, 8, 9, 1000, 1001],
        [1002, 1003, 1004, 1005, 1006, 1007],
    ]


def test_each_epoch_reshuffles_deterministically(tmp_path):
    _make_safetensors(str(tmp_path), [40, 40, 40])
    a = ShardDataset(str(tmp_path / "*.safetensors"), batch_size=8, shuffle=True, seed=5)
    b = ShardDataset(str(tmp_path / "*.safetensors"), batch_size=8, shuffle=True, seed=5)
    e0 = [_ids(x) for x in a]
    e1 = [_ids(x) for x in a]
    assert e0 == [_ids(x) for x in b] and e1 == [_ids(x) for x in b]
    assert e0 != e1
    a.set_epoch(0)
    assert [_ids(x) for x in a] == e0


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    world=st.integers(1, 7),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 1000),
    mix=st.integers(1, 4),
    equal=st.booleans(),
)
def test_rank_shares_are_disjoint_and_cover_every_sample_once(
    counts, world, seed, epoch, mix, equal
):
    ds = ShardDataset.__new__(ShardDataset)
    ds.shuffle, ds.seed, ds.mix_shards, ds.equal_shares = True, seed, mix, equal
    ds.world_size, ds.rank = world, 0
    ds.shards = counts
    ds._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ds.num_samples = int(sum(counts))
    order = ds.epoch_order(epoch)
    assert np.array_equal(order, ds.epoch_order(epoch)), "same seed and epoch, different order"
    assert sorted(order.tolist()) == list(range(ds.num_samples))
    shares = [ds.rank_indices(epoch, r).tolist() for r in range(world)]
    flat = [i for s in shares for i in s]
    assert len(flat) == len(set(flat)), "ranks share samples"
    if equal:
        assert len({len(s) for s in shares}) == 1
        assert len(flat) == ds.num_samples - ds.num_samples % world
    else:
        assert sorted(flat) == list(range(ds.num_samples))


def test_distributed_ranks_read_disjoint_samples(tmp_path):
    _make_safetensors(str(tmp_path), [33, 21])
    pattern = str(tmp_path / "*.safetensors")
    got = []
    for r in range(3):
        ds = ShardDataset(pattern, batch_size=4, shuffle=True, seed=9, rank=r, world_size=3)
        got.append([i for b in ds for i in _ids(b)])
    flat = [i for g in got for i in g]
    assert sorted(flat) == sorted(list(range(33)) + list(range(1000, 1021)))


def test_npy_and_raw_shards(tmp_path):
    for s in range(3):
        np.save(tmp_path / f"a{s}.npy", np.arange(20 * 4, dtype=np.int32).reshape(20, 4) + s * 100)
        (np.arange(12 * 5, dtype=np.uint16) + s).tofile(tmp_path / f"r{s}.bin")
    ds = ShardDataset(str(tmp_path / "a*.npy"), batch_size=7)
    rows = np.concatenate(list(ds))
    assert rows.shape == (60, 4) and rows.dtype == np.int32
    assert np.array_equal(rows[20], np.arange(4) + 100)
    raw = ShardDataset(
        str(tmp_path / "r*.bin"), record_dtype=np.uint16, record_shape=(3,), batch_size=None
    )
    samples = list(raw)
    assert raw.num_samples == 60 and samples[0].tolist() == [0, 1, 2]
    assert samples[20].tolist() == [1, 2, 3]
    assert raw.sample(21).tolist() == [4, 5, 6]


def test_truncated_npy_shard_is_a_clear_error(tmp_path):
    p = tmp_path / "a.npy"
    np.save(p, np.zeros((100, 10), dtype=np.float32))
    os.truncate(p, os.path.getsize(p) - 40)
    with pytest.raises(millrace.TruncatedFileError, match="truncated"):
        ShardDataset(str(p))


def test_truncated_safetensors_shard_is_a_clear_error(tmp_path):
    (p,) = _make_safetensors(str(tmp_path), [100])
    os.truncate(p, os.path.getsize(p) - 8)
    with pytest.raises(millrace.TruncatedFileError, match="truncated"):
        ShardDataset(p)


def test_raw_records_that_do_not_divide_the_file(tmp_path):
    p = tmp_path / "r.bin"
    p.write_bytes(b"x" * 1001)
    with pytest.raises(millrace.TruncatedFileError, match="whole number"):
        ShardDataset(str(p), record_bytes=100)
    with pytest.raises(ValueError, match="record_bytes"):
        ShardDataset(str(p))


def test_shard_truncated_after_opening_fails_iteration_without_hanging(tmp_path):
    paths = _make_safetensors(str(tmp_path), [100, 100])
    ds = ShardDataset(paths, batch_size=10)
    os.truncate(paths[1], 100)
    with pytest.raises(millrace.TruncatedFileError, match="changed size"):
        for _ in ds:
            pass


def test_dtype_mismatch_is_a_clear_error(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 2), dtype=np.float32))
    np.save(tmp_path / "b.npy", np.zeros((4, 2), dtype=np.float64))
    with pytest.raises(millrace.DTypeMismatchError, match="same names, dtypes"):
        ShardDataset(str(tmp_path / "*.npy"))
    with pytest.raises(millrace.DTypeMismatchError, match="dtype=int64"):
        ShardDataset(str(tmp_path / "a.npy"), dtype=np.int64)


def test_missing_shards_are_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no files match"):
        ShardDataset(str(tmp_path / "nothing-*.npy"))
    with pytest.raises(FileNotFoundError, match="No such file"):
        ShardDataset([str(tmp_path / "gone.npy")])


def test_works_with_torch_dataloader(tmp_path):
    torch = pytest.importorskip("torch")
    _make_safetensors(str(tmp_path), [30, 30])
    ds = ShardDataset(str(tmp_path / "*.safetensors"), batch_size=8, shuffle=True, seed=1)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    ids = [i for b in loader for i in b["y"].tolist()]
    assert sorted(ids) == list(range(30)) + list(range(1000, 1030))
    two = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    ids2 = [i for b in two for i in b["y"].tolist()]
    assert sorted(ids2) == list(range(30)) + list(range(1000, 1030))
