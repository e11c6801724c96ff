"""Reading muon-cpp checkpoints (``muon::distributed::save_checkpoint``) from Python.

A checkpoint is a directory ``step-<N>/`` holding ``manifest.json`` and one
data file per writing rank; docs/checkpoints.md documents the format. This
module needs only json and torch, plus ``xxhash`` (Debian: python3-xxhash)
to verify checksums::

    from muon_cpp.checkpoint import read_checkpoint
    manifest, tensors = read_checkpoint("ckpt")        # the newest complete one
    w = tensors["model/blocks.0.fc1.weight"]            # the global tensor
    m = tensors["optim/blocks.0.fc1.weight/momentum_buffer"]
    step = manifest["step"]

Every tensor comes back whole (its global shape), whatever layout and world
size saved it. It does not import the C++ extension.
"""
import json
import math
import os
import re
import struct
import sys

import torch

__all__ = ["DTYPES", "find_checkpoint", "read_checkpoint"]

FORMAT = "muon-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
MAGIC = b"MUONCKPT"
# magic, version (u32), rank (u32), step (i64), nonce (u64); little-endian,
# padded with zeros to 64 bytes.
HEADER = struct.Struct("<8sIIqQ")
HEADER_BYTES = 64

# The manifest's dtype names.
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}

_STEP_DIR = re.compile(r"step-[0-9]{8,}")


def _xxh3():
    try:
        import xxhash
    except ImportError as e:
        raise ImportError("verifying a checkpoint needs the xxhash module (Debian: python3-xxhash, "
                          "pip: xxhash); read_checkpoint(path, verify=False) skips the checksums") from e
    return xxhash.xxh3_64_hexdigest


def find_checkpoint(path):
    """The checkpoint directory `path` names: `path` itself when it holds a
    manifest.json, else its newest ``step-<N>`` subdirectory that does
    (unfinished saves have none and are skipped). Raises ValueError when
    there is none."""
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    if not os.path.isdir(path):
        raise ValueError("'%s' is not a directory" % path)
    steps = sorted((int(n[5:]), n) for n in os.listdir(path) if _STEP_DIR.fullmatch(n))
    for _, name in reversed(steps):
        if os.path.isfile(os.path.join(path, name, MANIFEST)):
            return os.path.join(path, name)
    raise ValueError("'%s' holds no complete checkpoint (%d step directories, none with a %s)"
                     % (path, len(steps), MANIFEST))


def _read_manifest(directory, verify):
    path = os.path.join(directory, MANIFEST)
    with open(path, "rb") as f:
        raw = f.read()
    if verify:
        # The last line is `"xxh3": "<16 hex>"}`; its checksum covers every
        # byte before the newline that precedes it.
        body = raw.rstrip(b"\n")
        cut = body.rfind(b"\n")
        seal = body[cut + 1:] if cut >= 0 else b""
        m = re.fullmatch(rb'"xxh3": "([0-9a-f]{16})"\}', seal)
        if not m or m.group(1).decode() != _xxh3()(raw[:cut]):
            raise ValueError("manifest %s does not match its checksum (the manifest is damaged)" % path)
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise ValueError("manifest %s is not valid JSON: %s" % (path, e)) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError("manifest %s is not a %s manifest" % (path, FORMAT))
    if manifest.get("version") != VERSION:
        raise ValueError("manifest %s has format version %r; this reader reads version %d"
                         % (path, manifest.get("version"), VERSION))
    missing = [k for k in ("step", "nonce", "world_size", "extra", "files", "state", "tensors") if k not in manifest]
    if missing:
        raise ValueError("manifest %s has no '%s'" % (path, missing[0]))
    for f in manifest["files"]:
        name = f.get("name") if isinstance(f, dict) else None
        if not isinstance(name, str) or not name or "/" in name or name.startswith(".") \
                or not isinstance(f.get("bytes"), int) or f["bytes"] < HEADER_BYTES:
            raise ValueError("manifest %s names a bad data file %r" % (path, name))
    return path, manifest


class _Files:
    """The manifest's data files, each opened and its header and size checked
    at its first use (so that errors name the tensor being read)."""

    def __init__(self, directory, manifest, xxh3):
        self.directory = directory
        self.manifest = manifest
        self.xxh3 = xxh3  # the checksum function, or None
        self.open = {}

    def get(self, index, key):
        if index in self.open:
            return self.open[index]
        entry = self.manifest["files"][index]
        path = os.path.join(self.directory, entry["name"])
        try:
            f = open(path, "rb")
        except OSError as e:
            raise ValueError("file %s cannot be opened: %s (the checkpoint is incomplete), reading '%s'"
                             % (path, e.strerror, key)) from None
        self.open[index] = (f, path)
        size = os.fstat(f.fileno()).st_size
        if size != entry["bytes"]:
            raise ValueError("file %s has %d bytes, the manifest says %d (truncated or replaced), reading '%s'"
                             % (path, size, entry["bytes"], key))
        header = f.read(HEADER_BYTES)
        if len(header) != HEADER_BYTES or header[:8] != MAGIC:
            raise ValueError("file %s is not a checkpoint data file, reading '%s'" % (path, key))
        _, version, _, step, nonce = HEADER.unpack_from(header)
        if version != VERSION:
            raise ValueError("file %s has format version %d, reading '%s'" % (path, version, key))
        if step != self.manifest["step"] or "%016x" % nonce != self.manifest["nonce"]:
            raise ValueError("file %s was written by the save of step %d, not by this checkpoint's (step %d): "
                             "files of different saves are mixed, reading '%s'"
                             % (path, step, self.manifest["step"], key))
        return self.open[index]

    def close(self):
        for f, _ in self.open.values():
            f.close()


def _check_tiling(key, chunks, shape):
    """The chunks must tile the shape: no two overlapping, their elements
    adding up to the shape's (each is inside it, checked before). Counting
    alone would let overlapping chunks whose counts add up leave part of
    the tensor unread. Sorted by first offset; each chunk is compared with
    the earlier ones whose first-dimension range it reaches."""
    total = math.prod(shape)
    if not shape:
        if len(chunks) != 1:
            raise ValueError("tensor '%s' is a scalar stored in %d chunks, not one" % (key, len(chunks)))
        return
    covered = 0
    open_ = []
    for offsets, sizes in sorted(chunks, key=lambda c: c[0][0]):
        n = math.prod(sizes)
        covered += n
        if n == 0:
            continue
        open_ = [(o, s) for o, s in open_ if o[0] + s[0] > offsets[0]]
        for o, s in open_:
            if all(max(a, b) < min(a + x, b + y) for a, x, b, y in zip(o, s, offsets, sizes)):
                raise ValueError("tensor '%s' has overlapping chunks at %s of %s and at %s of %s "
                                 "(damaged or forged manifest)" % (key, o, s, offsets, sizes))
        open_.append((offsets, sizes))
    if covered != total:
        raise ValueError("tensor '%s': its chunks hold %d of its %d elements (damaged or forged manifest)"
                         % (key, covered, total))


def _read_tensor(files, key, entry):
    dtype = DTYPES.get(entry["dtype"])
    if dtype is None:
        raise ValueError("tensor '%s' has an unknown dtype '%s'" % (key, entry["dtype"]))
    shape = [int(d) for d in entry["shape"]]
    element = torch.empty((), dtype=dtype).element_size()
    if any(d < 0 for d in shape) or math.prod(shape) >= 2 ** 63:
        raise ValueError("tensor '%s' has a bad shape %s" % (key, shape))
    for c in entry["chunks"]:
        offsets, sizes = list(c["offsets"]), list(c["sizes"])
        if (len(offsets) != len(shape) or len(sizes) != len(shape)
                or any(o < 0 or s < 0 or o + s > d for o, s, d in zip(offsets, sizes, shape))):
            raise ValueError("tensor '%s' has a chunk at %s of %s outside its shape %s"
                             % (key, offsets, sizes, shape))
    _check_tiling(key, [(list(c["offsets"]), list(c["sizes"])) for c in entry["chunks"]], shape)
    out = torch.empty(shape, dtype=dtype)
    filled = 0
    for c in entry["chunks"]:
        offsets, sizes = list(c["offsets"]), list(c["sizes"])
        index = c["file"]
        if not 0 <= index < len(files.manifest["files"]):
            raise ValueError("tensor '%s' has a chunk in file %r, which the manifest does not list" % (key, index))
        nbytes = math.prod(sizes) * element
        if c["bytes"] != nbytes or c["offset"] < HEADER_BYTES \
                or c["offset"] + nbytes > files.manifest["files"][index]["bytes"]:
            raise ValueError("tensor '%s' has a chunk whose file, offset or length is inconsistent" % key)
        f, path = files.get(index, key)
        f.seek(c["offset"])
        data = bytearray(nbytes)
        if f.readinto(data) != nbytes:
            raise ValueError("file %s ends inside '%s' (truncated?)" % (path, key))
        if files.xxh3 is not None and files.xxh3(data) != c["xxh3"]:
            raise ValueError("file %s: the bytes of '%s' at %s do not match their checksum (the file is damaged)"
                             % (path, key, offsets))
        if nbytes:
            part = torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(sizes)
            out[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))] = part
        filled += math.prod(sizes)
    if filled != out.numel():
        raise ValueError("tensor '%s': the chunks cover %d of its %d elements" % (key, filled, out.numel()))
    return out


def read_checkpoint(path, verify=True):
    """Reads a checkpoint: `path` is one ``step-<N>`` directory or a directory
    of them (then the newest complete one). Returns ``(manifest, tensors)``:
    the manifest as a dict (step, world_size, extra, files, state, tensors,
    ...) and every logical tensor by key (``model/<param>``,
    ``optim/<param>/<field>``) as a whole torch tensor on the CPU.

    Checks each data file's header (magic, version, step and save) and size
    and, with `verify`, the manifest's checksum and every chunk's XXH3-64
    (needs the xxhash module). Raises ValueError naming the file and the
    tensor for a damaged, truncated, missing or mixed-in file.
    """
    if sys.byteorder != "little":
        raise ValueError("checkpoints are little-endian; this reader runs on little-endian hosts only")
    directory = find_checkpoint(path)
    path, manifest = _read_manifest(directory, verify)
    files = _Files(directory, manifest, _xxh3() if verify else None)
    try:
        tensors = {key: _read_tensor(files, key, entry) for key, entry in manifest["tensors"].items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError("manifest %s is missing an entry or has one of the wrong type: %r" % (path, e)) from None
    finally:
        files.close()
    return manifest, tensors
