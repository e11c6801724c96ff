"""muon_cpp.checkpoint.read_checkpoint against checkpoints the C++ library
writes (tests/distributed/checkpoint_writer: the checkpoint tests' model, trained
and saved by muon::distributed::save_checkpoint on thread ranks). Every tensor
read must equal, bit for bit, what the ranks held (their --dump, assembled:
single process, sharded over 3 ranks, layer-wise over 2); tensor-parallel
and 2-D checkpoints must read as the single process's tensors; damaged,
truncated, missing and mixed files and an edited manifest must be errors
naming the file (and the tensor).

The writer is found through MUON_CHECKPOINT_WRITER (ctest sets it), else
$MUON_BUILD_DIR/tests/checkpoint_writer, else build/tests/checkpoint_writer.
"""
import json
import os
import shutil
import struct
import subprocess

import pytest
import torch

pytest.importorskip("xxhash", reason="the checkpoint reader's checksums need xxhash (python3-xxhash)")

from muon_cpp.checkpoint import read_checkpoint  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3


def _writer():
    path = os.environ.get("MUON_CHECKPOINT_WRITER")
    if not path:
        build = os.environ.get("MUON_BUILD_DIR", os.path.join(ROOT, "build"))
        path = os.path.join(build, "tests", "checkpoint_writer")
    assert os.access(path, os.X_OK), "no checkpoint_writer at %s (build the target checkpoint_writer)" % path
    return path


def _run_writer(tmp, layout, world):
    """Checkpoints of STEPS steps in tmp/ckpt (the newest 2 kept) and the ranks' dumps."""
    ckpt = tmp / "ckpt"
    prefix = tmp / "dump"
    cmd = [_writer(), str(ckpt), str(world), layout, str(STEPS), "--keep", "2", "--dump", str(prefix)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    dumps = []
    for rank in range(world):
        with open("%s.rank%d.json" % (prefix, rank)) as f:
            dumps.append(json.load(f))
    return ckpt, dumps


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """written(layout, world): the writer's checkpoints and dumps, made once."""
    cache = {}

    def get(layout, world):
        if (layout, world) not in cache:
            cache[layout, world] = _run_writer(tmp_path_factory.mktemp("%s-w%d" % (layout, world)), layout, world)
        return cache[layout, world]

    return get


@pytest.fixture(scope="module", params=[("none", 1), ("sharded", 3), ("layerwise", 2)],
                ids=["none-w1", "sharded-w3", "layerwise-w2"])
def saved(request, written):
    layout, world = request.param
    return (layout, world) + written(layout, world)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return _run_writer(tmp_path_factory.mktemp("sharded-damage"), "sharded", 3)


def _assemble(dumps):
    """Every key's whole tensor (float64) from the ranks' parts, each placed
    at its row_offset; a place held by several ranks must hold the same
    value on each, and every place must be held."""
    out = {}
    for key in set().union(*dumps):
        parts = [d[key] for d in dumps if key in d]
        tail = parts[0]["shape"][1:]
        if parts[0]["shape"]:
            shape = [max(p["row_offset"] + p["shape"][0] for p in parts)] + tail
        else:
            shape = []
        whole = torch.full(shape, float("nan"), dtype=torch.float64)
        for p in parts:
            assert p["shape"][1:] == tail, key
            local = torch.tensor(p["values"], dtype=torch.float64).reshape(p["shape"])
            dst = whole.narrow(0, p["row_offset"], p["shape"][0]) if shape else whole
            held = ~torch.isnan(dst)
            assert torch.equal(dst[held], local[held]), "%s: ranks disagree" % key
            dst.copy_(local)
        assert not torch.isnan(whole).any(), "%s: a place no rank holds" % key
        out[key] = whole
    return out


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def _step_dir(ckpt, step=STEPS):
    return ckpt / ("step-%08d" % step)


def _file_of_rank(step_dir, rank):
    (name,) = [n for n in os.listdir(step_dir) if n.startswith("rank-%05d-" % rank) and n.endswith(".bin")]
    return step_dir / name


def test_every_tensor_equals_what_the_ranks_held(saved):
    layout, world, ckpt, dumps = saved
    manifest, tensors = read_checkpoint(ckpt)
    assert manifest["step"] == STEPS and manifest["world_size"] == world
    assert manifest["extra"] == "extra %d" % STEPS
    assert sorted(os.listdir(ckpt)) == ["step-%08d" % (STEPS - 1), "step-%08d" % STEPS]
    assert sorted(f["rank"] for f in manifest["files"]) == list(range(world))
    assert set(manifest["state"].values()) == {"muon", "adamw"}

    expected = _assemble(dumps)
    assert set(tensors) == set(expected)
    assert set(tensors) == set(manifest["tensors"])
    for key, t in tensors.items():
        entry = manifest["tensors"][key]
        assert list(t.shape) == entry["shape"] == list(expected[key].shape), key
        assert str(t.dtype) == "torch." + entry["dtype"], key
        e = expected[key].to(t.dtype)
        assert torch.equal(_bits(t), _bits(e)), key
        # A row shard is one chunk per rank; a replicated tensor one chunk
        # (written by the lowest rank that holds it).
        chunks = world if layout == "sharded" and t.dim() > 0 else 1
        assert len(entry["chunks"]) == chunks, key
    # Something trained: the stored step and a moved momentum.
    assert all(tensors[k].item() == STEPS for k in tensors if k.endswith("/step"))
    assert tensors["optim/blocks.0.fc1.weight/momentum_buffer"].abs().sum() > 0

    # The same from the step directory itself, unverified, and past an
    # unfinished newer save.
    os.makedirs(_step_dir(ckpt, 9))
    try:
        for m, ts in (read_checkpoint(_step_dir(ckpt)), read_checkpoint(ckpt, verify=False),
                      read_checkpoint(ckpt)):
            assert m["step"] == STEPS
            assert all(torch.equal(_bits(ts[k]), _bits(tensors[k])) for k in tensors)
    finally:
        os.rmdir(_step_dir(ckpt, 9))


@pytest.mark.parametrize("layout,world", [("tp", 2), ("2d", 4)])
def test_tensor_parallel_layouts_read_as_the_single_process_tensors(written, layout, world):
    """TP blocks (fc2 split by columns) and 2-D blocks (row shards of TP
    blocks) assemble into the tensors one process trains (equal up to the
    Newton-Schulz rounding of the distributed layouts)."""
    _, single = read_checkpoint(written("none", 1)[0])
    manifest, tensors = read_checkpoint(written(layout, world)[0])
    assert manifest["world_size"] == world and set(tensors) == set(single)
    assert len(manifest["tensors"]["model/blocks.0.fc2.weight"]["chunks"]) == world
    for key, t in tensors.items():
        ref = single[key]
        assert t.shape == ref.shape and t.dtype == ref.dtype, key
        scale = ref.double().abs().max().clamp(min=1e-30)
        assert ((t.double() - ref.double()).abs().max() / scale).item() <= 1e-6, key


@pytest.fixture
def copy(sharded, tmp_path):
    """A fresh copy of the sharded checkpoints, to damage."""
    ckpt, _ = sharded
    dst = tmp_path / "ckpt"
    shutil.copytree(ckpt, dst)
    return dst


def _raises(path, *words, **kw):
    with pytest.raises(ValueError) as e:
        read_checkpoint(path, **kw)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return str(e.value)


def test_a_flipped_bit_in_a_chunk_names_the_file_and_the_tensor(copy):
    d = _step_dir(copy)
    _, good = read_checkpoint(d)
    manifest = json.loads((d / "manifest.json").read_text())
    key = "model/blocks.0.fc1.weight"
    path = _file_of_rank(d, 1)
    index = [i for i, f in enumerate(manifest["files"]) if f["name"] == path.name][0]
    (chunk,) = [c for c in manifest["tensors"][key]["chunks"] if c["file"] == index]
    data = bytearray(path.read_bytes())
    data[chunk["offset"] + 37] ^= 0x10
    path.write_bytes(data)
    _raises(d, path.name, key, "checksum")
    _raises(copy, path.name, key, "checksum")
    # Unverified, it reads: the one damaged element differs.
    _, damaged = read_checkpoint(d, verify=False)
    assert (damaged[key] != good[key]).sum().item() == 1


def test_an_edited_manifest_is_an_error(copy):
    d = _step_dir(copy)
    path = d / "manifest.json"
    raw = path.read_bytes()
    # "world_size": 3 -> 2 is one bit and still valid JSON.
    at = raw.index(b'"world_size": 3') + len(b'"world_size": ')
    edited = bytearray(raw)
    edited[at] ^= 0x01
    path.write_bytes(edited)
    assert json.loads(edited)["world_size"] == 2
    _raises(d, "manifest.json", "checksum")
    # Any bit of the body.
    edited = bytearray(raw)
    edited[len(raw) // 2] ^= 0x04
    path.write_bytes(edited)
    _raises(d, "manifest.json", "checksum")


def _reseal(path, manifest):
    """Writes `manifest` with a valid seal (the last line holds the XXH3 of
    every byte before it, as the library writes it), so that only its
    content is wrong."""
    import xxhash
    manifest = dict(manifest)
    manifest.pop("xxh3", None)
    body = json.dumps(manifest, indent=1).rstrip()
    body = body[:body.rindex("}")].rstrip() + ","
    path.write_bytes((body + '\n"xxh3": "%s"}\n' % xxhash.xxh3_64_hexdigest(body.encode())).encode())


def _forged(copy, edit):
    """The newest step of `copy` with edit(manifest) applied and resealed;
    returns (step dir, the edited tensor's key)."""
    d = _step_dir(copy)
    path = d / "manifest.json"
    manifest = json.loads(path.read_bytes())
    key = next(k for k, e in manifest["tensors"].items()
               if len(e["shape"]) == 2 and sum(c["sizes"][0] > 0 for c in e["chunks"]) >= 2)
    chunks = sorted((c for c in manifest["tensors"][key]["chunks"] if c["sizes"][0] > 0),
                    key=lambda c: c["offsets"][0])
    edit(chunks)
    _reseal(path, manifest)
    return d, key


def _cxx_load_fails(copy, *words):
    """muon::distributed::load_checkpoint (the writer resumes from the newest
    checkpoint) refuses it too, in one bounded line naming what is wrong."""
    r = subprocess.run([_writer(), str(copy), "3", "sharded", str(STEPS + 1), "--keep", "2"],
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    for w in words:
        assert w in out, (w, out)


def test_overlapping_chunks_whose_counts_add_up_are_an_error(copy):
    # A valid checksum, chunks inside the shape, element counts that add up,
    # but the second chunk moved up one row: one row read twice, one in no
    # chunk. Counting alone would load it.
    def overlap(chunks):
        chunks[1]["offsets"][0] -= 1

    d, key = _forged(copy, overlap)
    _raises(d, key, "overlapping chunks")
    _cxx_load_fails(copy, key, "overlapping chunks")


def test_a_chunk_offset_past_int64_is_an_error(copy):
    def far(chunks):
        chunks[1]["offsets"][0] = 2 ** 63 - 1

    d, key = _forged(copy, far)
    _raises(d, key, "outside its shape")
    _cxx_load_fails(copy, key, "outside its shape")


def test_a_truncated_or_missing_file_is_an_error(copy):
    d = _step_dir(copy)
    path = _file_of_rank(d, 0)
    os.truncate(path, path.stat().st_size - 100)
    _raises(d, path.name, "truncated")
    _raises(d, path.name, "truncated", verify=False)
    os.remove(path)
    _raises(d, path.name, "cannot be opened")


def test_files_of_two_saves_are_an_error(copy):
    # Rank 1's file of the step-2 save under the step-3 save's name.
    d = _step_dir(copy)
    path = _file_of_rank(d, 1)
    shutil.copyfile(_file_of_rank(_step_dir(copy, STEPS - 1), 1), path)
    _raises(d, path.name, "step %d" % (STEPS - 1), "mixed")


def test_no_complete_checkpoint_is_an_error(tmp_path):
    os.makedirs(tmp_path / "step-00000001")
    _raises(tmp_path, "no complete checkpoint")
    _raises(tmp_path / "nothing", "not a directory")


def _write(step_dir, tensors, step=7, nonce=0x0123456789ABCDEF):
    """A checkpoint of `tensors` in the documented format (docs/checkpoints.md),
    one data file, each tensor split by rows into two chunks where it can be."""
    import xxhash

    os.makedirs(step_dir)
    name = "rank-00000-%016x.bin" % nonce
    data = bytearray(struct.pack("<8sIIqQ", b"MUONCKPT", 1, 0, step, nonce).ljust(64, b"\0"))
    entries = {}
    for key, t in tensors.items():
        cuts = [0, t.shape[0] // 2, t.shape[0]] if t.dim() else [0, 0]
        chunks = []
        for lo, hi in zip(cuts, cuts[1:]):
            part = t[lo:hi] if t.dim() else t
            raw = part.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            if not raw:
                continue
            data += b"\0" * (-len(data) % 64)
            chunks.append({"offsets": [lo] + [0] * (t.dim() - 1) if t.dim() else [],
                           "sizes": list(part.shape), "file": 0, "offset": len(data),
                           "bytes": len(raw), "xxh3": xxhash.xxh3_64_hexdigest(raw)})
            data += raw
        entries[key] = {"dtype": str(t.dtype)[6:], "shape": list(t.shape), "chunks": chunks}
    (step_dir / name).write_bytes(data)
    manifest = {"format": "muon-checkpoint", "version": 1, "step": step, "nonce": "%016x" % nonce,
                "world_size": 1, "extra": "", "files": [{"name": name, "rank": 0, "bytes": len(data)}],
                "state": {}, "tensors": entries}
    body = json.dumps(manifest, indent=1)[:-1].rstrip("\n") + ","
    (step_dir / "manifest.json").write_text(body + '\n"xxh3": "%s"}\n' % xxhash.xxh3_64_hexdigest(body.encode()))


def test_every_dtype_reads_back_exactly(tmp_path):
    """A checkpoint written by the format's description alone: every dtype,
    scalars and empty tensors read back bit for bit."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, 2, generator=gen, dtype=torch.float64) * 100
    tensors = {"f32": x.float(), "f64": x, "bf16": x.bfloat16(), "f16": x.half(),
               "i64": x.long() * 2**40, "i32": x.int(), "i16": x.short(), "i8": x.char(),
               "u8": x.byte(), "bool": x > 0, "scalar": torch.tensor(12345678901, dtype=torch.int64),
               "empty": torch.zeros(0, 4), "row": x[0, :, 0].float()}
    _write(tmp_path / "step-00000007", tensors)
    manifest, read = read_checkpoint(tmp_path)
    assert manifest["step"] == 7 and set(read) == set(tensors)
    for key, t in tensors.items():
        assert read[key].dtype == t.dtype and read[key].shape == t.shape, key
        assert torch.equal(_bits(read[key]), _bits(t)), key
