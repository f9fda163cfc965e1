"""Reading an .om: load_om verifies every member and the manifest's routing; is_om sniffs."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from graphopt import __version__ as GRAPHOPT_VERSION
from graphopt.codegen.om_file import OpenedFile
from graphopt.codegen.om_manifest import (
    DETAILS_NAME,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    PARTITION_DIR,
    Malformed,
    check_details,
    check_manifest,
    check_member_name,
    order_profile_dims,
    route,
    sha256,
)
from graphopt.codegen.om_weights import (WEIGHTS_DIR, BadReference, check_references, names_a_file,
                                         with_weights)
from graphopt.codegen.om_zip import Member, MemoryZip, plain_zip
from graphopt.errors import ArtifactError

if TYPE_CHECKING:  # imported where a partition is parsed: a load need not import onnx
    import onnx

    from graphopt.codegen.om_write import OmPartition

Archive = zipfile.ZipFile | MemoryZip  # zipfile's reader, or om_zip's for a small plain artifact
Entry = zipfile.ZipInfo | Member

# The manifest is parsed before anything is verified: bound what a hostile file can make us read.
_MAX_MANIFEST_BYTES = 64 << 20
# What the other members (read whole at load) may hold: a partition no more than a protobuf
# can (onnxruntime cannot parse more), the details and anything else far less. A deflated
# member of 3 GiB that its manifest declared honestly took 6 GB of memory from a 3 MB file.
_MAX_PARTITION_BYTES = (2 << 30) - 1
_MAX_OTHER_BYTES = 256 << 20


def _read_manifest(zf: Archive) -> dict:
    try:
        info = zf.getinfo(MANIFEST_NAME)
    except KeyError:
        raise Malformed(f"no {MANIFEST_NAME} (a zip, but not a graphopt .om)") from None
    if info.file_size > _MAX_MANIFEST_BYTES:
        raise Malformed(f"{MANIFEST_NAME} is implausibly large ({info.file_size} bytes)")
    data = _stored_checked(zf, info) if info.compress_type == zipfile.ZIP_STORED \
        else _inflated(zf, info)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise Malformed(f"{MANIFEST_NAME} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise Malformed(f"{MANIFEST_NAME} is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise Malformed(
            f"not a graphopt .om (manifest format is {manifest.get('format')!r}, expected {FORMAT!r})"
        )
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise Malformed(f"manifest format_version is {version!r}, not an integer")
    if version > FORMAT_VERSION:
        raise Malformed(
            f"format_version {version} is newer than this graphopt {GRAPHOPT_VERSION} reads "
            f"(up to {FORMAT_VERSION}); upgrade graphopt or recompile the model"
        )
    if version < 1:
        raise Malformed(f"unsupported format_version {version}")
    return manifest


def _check_routing(manifest: dict) -> None:
    """The routing of the artifact, or of each profile, against its partitions' inputs and
    outputs (a profile's own entries hold its execution_order and routing)."""
    by_name = {p["name"]: p for p in manifest["partitions"]}
    plans = manifest.get("profiles") or [manifest]
    if plans[0]["routing"] != manifest["routing"]:
        raise Malformed("manifest routing is not the default (first) profile's")
    for plan in plans:
        where = f"profile {plan['name']!r}: " if plan is not manifest else ""
        ordered = [(n, by_name[n]["inputs"], by_name[n]["outputs"]) for n in plan["execution_order"]]
        try:
            top_inputs, top_outputs, routing = route(ordered, [o["name"] for o in manifest["outputs"]],
                                                     [i["name"] for i in manifest["inputs"]])
        except ValueError as exc:
            raise Malformed(f"{where}inconsistent partitions: {exc}") from None
        if top_inputs != [i["name"] for i in manifest["inputs"]]:
            raise Malformed(f"{where}manifest inputs do not match the inputs the partitions need")
        if routing != plan["routing"]:
            raise Malformed(f"{where}manifest routing does not match the partitions' inputs "
                            "and outputs")


_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zip's local file header, 30 bytes


def _data_offset(zf: Archive, info: Entry) -> int:
    """Where an uncompressed member's bytes start in the file (after its local header)."""
    if info.header_offset < 0:  # zipfile's, from a corrupt directory: a seek in memory would
        raise zipfile.BadZipFile("bad local file header offset")  # raise ValueError
    fp = zf.fp
    fp.seek(info.header_offset)
    header = fp.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile("bad local file header")
    name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
    return info.header_offset + _LOCAL_HEADER.size + name_length + extra_length


def _stored_bytes(zf: Archive, info: Entry) -> bytes:
    """An uncompressed member's bytes in one read. zipfile would also CRC them chunk by chunk,
    which costs as much as the sha256 check the caller does anyway."""
    fp = zf.fp
    fp.seek(_data_offset(zf, info))
    data = fp.read(info.file_size)
    if len(data) != info.file_size:
        raise EOFError("member data ends early")
    return data


def _stored_checked(zf: Archive, info: Entry) -> bytes:
    """An uncompressed member's bytes, checked against the zip's CRC-32: for the manifest,
    which no sha256 covers."""
    data = _stored_bytes(zf, info)
    if zlib.crc32(data) != info.CRC:
        raise zipfile.BadZipFile(f"bad CRC-32 for {info.filename!r}")
    return data


def _inflated(zf: zipfile.ZipFile, info: Entry) -> bytes:
    """A deflated member's bytes, inflated a MiB at a time: zipfile's read() inflates up to
    2 GiB in one call before it cuts at the size the zip directory gives, which a hostile
    member's stream exceeds at will (2 GB of memory for a member declared 1000 bytes)."""
    with zf.open(info) as member:
        return b"".join(iter(lambda: member.read(1 << 20), b""))


def _member_info(zf: Archive, name: str, expected: dict) -> Entry:
    try:
        info = zf.getinfo(name)
    except KeyError:
        raise Malformed(f"member {name!r} listed in the manifest is missing from the archive") from None
    if info.file_size != expected["size"]:
        raise Malformed(
            f"member {name!r} has size {info.file_size}, manifest says {expected['size']} "
            "(tampered or corrupt)"
        )
    return info


def _weights_span(zf: Archive, name: str, expected: dict) -> tuple[int, int]:
    """(data offset in the file, size) of a weights blob, which stays on disk: onnxruntime maps
    it, and the checksum is computed from the file."""
    info = _member_info(zf, name, expected)
    if info.compress_type != zipfile.ZIP_STORED:
        raise Malformed(f"weights member {name!r} is compressed; graphopt stores weights as is")
    try:
        return _data_offset(zf, info), info.file_size
    except (zipfile.BadZipFile, OSError) as exc:
        raise Malformed(f"member {name!r} is corrupt ({exc})") from None


def _read_member(zf: Archive, name: str, expected: dict) -> bytes:
    # The declared size is compared first: it also bounds how much a zip bomb can make us inflate.
    info = _member_info(zf, name, expected)
    limit = _MAX_PARTITION_BYTES if name.startswith(PARTITION_DIR) else _MAX_OTHER_BYTES
    if info.file_size > limit:
        raise Malformed(f"member {name!r} is implausibly large ({info.file_size} bytes; at most "
                        f"{limit} for such a member)")
    try:
        data = _stored_bytes(zf, info) if info.compress_type == zipfile.ZIP_STORED \
            else _inflated(zf, info)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, NotImplementedError) as exc:
        raise Malformed(f"member {name!r} is corrupt ({exc})") from None
    return data


def _check_sha256(name: str, data, expected: dict) -> None:
    if sha256(data) != expected["sha256"]:
        raise Malformed(f"member {name!r} fails its sha256 check (tampered or corrupt)")


def _check_file_range(file: OpenedFile, name: str, span: tuple[int, int], expected: dict,
                      workers: int, every_sum: bool = False) -> None:
    offset, size = span
    if size == 0:
        _check_sha256(name, b"", expected)
        return
    try:
        with file.mapped() as mapped:
            if offset + size > len(mapped):
                raise Malformed(f"member {name!r} ends past the end of the file (truncated?)")
            with memoryview(mapped) as view:
                good = _sums_match(view[offset:offset + size], expected, workers, every_sum)
    except (OSError, ValueError) as exc:  # ValueError: mmap of a file emptied since
        raise Malformed(f"cannot read member {name!r} ({getattr(exc, 'strerror', None) or exc})") from None
    if not good:
        raise Malformed(f"member {name!r} fails its sha256 check (tampered or corrupt)")


def _sums_match(data: memoryview, expected: dict, workers: int, every_sum: bool = False
                ) -> bool:
    """Whether `data` has the member's checksums: per chunk on `workers` threads when the
    manifest has chunk sums, else the whole sha256 in one call; `every_sum`: both, so that a
    manifest whose two disagree (written by hand) is refused whatever the core count. Releases
    `data`.

    One call hashes without the GIL from start to end; a thread hashing chunk after chunk
    needs the GIL between them, and onnxruntime keeps it while it builds a session."""
    with data:
        chunks = expected.get("chunk_sha256")
        if every_sum and chunks and len(chunks) > 1:
            if sha256(data) != expected["sha256"]:
                return False
            workers = max(workers, 2)  # the chunks too, even on one core
        if not chunks or workers <= 1 or len(chunks) == 1:
            return sha256(data) == expected["sha256"]
        import concurrent.futures  # with logging, ~6 ms a process; only large blobs need it

        step = expected["chunk_bytes"]
        parts = [data[i:i + step] for i in range(0, len(data), step)]
        try:
            with concurrent.futures.ThreadPoolExecutor(min(len(parts), workers)) as pool:
                return list(pool.map(sha256, parts)) == chunks
        finally:
            for part in parts:
                part.release()


def cpu_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def may_reference_files(data: bytes) -> bool:
    """Whether a serialized ONNX model may reference external data (`names_a_file`); when it
    cannot, onnxruntime reads nothing but its bytes.

    True without looking past SCAN_BYTES: searching costs ~0.4 µs per KB, more than parsing
    the model and walking its references once its bytes are mostly tensor data."""
    return len(data) > SCAN_BYTES or names_a_file(data)


SCAN_BYTES = 64 << 10


def _parse_partition(part: dict, data: bytes, weights: dict[str, int]) -> onnx.ModelProto:
    import onnx

    from graphopt.codegen.om_write import graph_inputs

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)  # plain protobuf decoding: nothing in the file is executed
    except Exception as exc:  # protobuf's DecodeError type differs between its implementations
        raise Malformed(f"partition {part['name']!r} is not a valid ONNX model ({exc})") from None
    try:  # external data may only point into the artifact's own weights members
        check_references(model, weights)
    except BadReference as exc:
        raise Malformed(f"partition {part['name']!r}: {exc}") from None
    inputs = set(graph_inputs(model))
    outputs = {vi.name for vi in model.graph.output}
    problem = routing_mismatch(part, inputs, outputs)
    if problem:
        raise Malformed(problem)
    return model


def routing_mismatch(part: dict, inputs, outputs) -> str | None:
    """Why a partition's model (its graph `inputs` and `outputs`, weights excluded) does not
    take and return what its manifest entry `part` routes; None when it does."""
    for tensor in part["inputs"]:
        if tensor not in inputs:
            return f"partition {part['name']!r} input {tensor!r} is not one of its model's"
    for tensor in part["outputs"]:
        if tensor not in outputs:
            return f"partition {part['name']!r} output {tensor!r} is not one of its model's"
    return None


class PartitionModels(Mapping):
    """The partition models by name, each parsed and checked (external references, inputs and
    outputs) when first asked for; a model that fails raises ArtifactError then.

    load_om parses them all before it returns; with defer_checks=True only what is asked for."""

    def __init__(self, path: str, manifest: dict, members: dict[str, bytes],
                 weights: dict[str, int]) -> None:
        self._path = path
        self._parts = {p["name"]: p for p in manifest["partitions"]}
        self._members = members
        self._weights = weights  # weights member -> size: where references may point
        self._parsed: dict[str, onnx.ModelProto] = {}

    def __getitem__(self, name: str) -> onnx.ModelProto:
        model = self._parsed.get(name)
        if model is None:
            model = self._parsed[name] = self.parse(name)
        return model

    def parse(self, name: str) -> onnx.ModelProto:
        """Partition `name`'s model, checked, without keeping it: the runtime needs it only
        while onnxruntime builds the session, and a second copy of the weights would stay."""
        if name in self._parsed:
            return self._parsed[name]
        part = self._parts[name]
        try:
            return _parse_partition(part, self._members[part["member"]], self._weights)
        except Malformed as exc:
            raise ArtifactError(f"{self._path}: {exc}") from None

    def is_kept(self, name: str) -> bool:
        """Whether `parse(name)` hands out the model kept for callers (not one to change)."""
        return name in self._parsed

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)


@dataclasses.dataclass(frozen=True)
class OmArtifact:
    """A loaded .om: its manifest, member bytes and partition models. Verified, unless
    load_om was asked to defer the checksums (`verified` False): then verify_checksums()
    must pass before anything computed from its partitions or weights is trusted."""

    path: str
    manifest: dict
    members: dict[str, bytes]              # every member but the weights blobs
    models: Mapping[str, onnx.ModelProto]  # by partition name, weights referenced, not included
    spans: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    # weights member -> (offset of its bytes in the file, size); they stay on disk
    verified: bool = True  # False: the partitions' and weights' sha256 sums are not checked yet
    # The file, held open when it has weights blobs: they are read through it, not the path.
    file: OpenedFile | None = dataclasses.field(default=None, compare=False, repr=False)
    location: str = ""  # the absolute path it was loaded from (where a copy reloads it)

    @property
    def inputs(self) -> list[dict]:
        return self.manifest["inputs"]

    @property
    def outputs(self) -> list[dict]:
        return self.manifest["outputs"]

    @property
    def execution_order(self) -> list[str]:
        return self.manifest["execution_order"]

    @property
    def profiles(self) -> list[dict]:
        """The shape profiles ({"name", "dims", "inputs", …}), default first; [] without."""
        return self.manifest.get("profiles", [])

    def profile(self, name: str) -> "OmArtifact":
        """The artifact as one profile sees it: that profile's signature, partitions and
        routing (members, models and weights shared, nothing read again)."""
        entry = next((p for p in self.profiles if p["name"] == name), None)
        if entry is None:
            known = ", ".join(p["name"] for p in self.profiles) or "none"
            raise KeyError(f"{self.path} has no shape profile {name!r} (profiles: {known})")
        view = {key: entry[key] for key in ("inputs", "outputs", "execution_order", "routing")}
        manifest = {k: v for k, v in self.manifest.items() if k != "profiles"}
        return dataclasses.replace(self, manifest={**manifest, **view})

    @property
    def routing(self) -> list[dict]:
        return self.manifest["routing"]

    @functools.cached_property
    def details(self) -> dict:
        """{"pass_log": [...], "extra": {...}}: the details member, parsed when first asked for
        (its sha256 checked at load, or here when load_om deferred the checks), or the
        manifest's own for an artifact written before that member existed. ArtifactError if
        it is malformed or fails its sum."""
        if "details" not in self.manifest:
            return {"pass_log": self.manifest["pass_log"], "extra": self.manifest["extra"]}
        try:
            if not self.verified:  # load_om(defer_checks=True) left its sum to this first read
                _check_sha256(DETAILS_NAME, self.members[DETAILS_NAME],
                              self.manifest["members"][DETAILS_NAME])
            try:
                details = json.loads(self.members[DETAILS_NAME].decode("utf-8"))
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # [[[…]]]: too deep
                raise Malformed(f"{DETAILS_NAME} is not valid JSON ({exc})") from None
            check_details(details)
        except Malformed as exc:
            raise ArtifactError(f"{self.path}: {exc}") from None
        return details

    @property
    def pass_log(self) -> list:
        """What each pass of the compile did, in order."""
        return self.details["pass_log"]

    @property
    def extra(self) -> dict:
        """The compile's extras: memory plan, partitioning, kernel tilings, profiles…"""
        return self.details["extra"]

    def verify_checksums(self) -> None:
        """Check every member against the manifest's sha256; ArtifactError on a mismatch."""
        self.verify_members()
        self.verify_weights()

    def verify_members(self, names: Iterable[str] | None = None) -> None:
        """Check members held in memory (`names`, default all but the weights blobs) against
        their sha256."""
        try:
            for name in sorted(self.members if names is None else names):
                _check_sha256(name, self.members[name], self.manifest["members"][name])
        except Malformed as exc:
            raise ArtifactError(f"{self.path}: {exc}") from None

    def verify_weights(self, workers: int | None = None) -> None:
        """Check the weights blobs, read from the file, against the manifest's sha256, on
        `workers` threads. By default on one per core and against every sum the manifest
        gives (the whole blob's and its chunks'): a full check, for inspect and the tools,
        where the runtime's check on the side of session creation verifies one of them."""
        every_sum = workers is None
        workers = workers or cpu_count()
        try:
            for name, span in sorted(self.spans.items()):
                _check_file_range(self.file, name, span, self.manifest["members"][name], workers,
                                  every_sum)
        except Malformed as exc:
            raise ArtifactError(f"{self.path}: {exc}") from None

    def member(self, name: str) -> bytes:
        """The bytes of a member, e.g. "partitions/p0.onnx" (a weights blob is read from the
        file; verify_weights checks it)."""
        if name in self.spans:
            offset, size = self.spans[name]
            try:
                return self.file.read(offset, size)
            except OSError as exc:
                raise ArtifactError(f"{self.path}: cannot read member {name!r} "
                                    f"({exc.strerror or exc})") from None
        return self.members[name]

    def partition_model(self, name: str) -> onnx.ModelProto:
        """Partition `name`'s model with its weights inside it: a standalone ONNX model.
        KeyError naming the partitions there are for a name that is not one of them (in an
        artifact with shape profiles they are named `profile0.p0_cpu`)."""
        if name not in {p["name"] for p in self.manifest["partitions"]}:
            known = ", ".join(p["name"] for p in self.manifest["partitions"])
            raise KeyError(f"{self.path} has no partition {name!r} (partitions: {known})")
        return with_weights(self.models[name], self.member)

    @property
    def partition_members(self) -> list[str]:
        """The members holding the partition models, whose sums defer_checks leaves to the
        caller (the details' sum, also left, is checked when they are first read)."""
        return _partition_members(self.manifest)

    @property
    def partitions(self) -> list[OmPartition]:
        """The partitions in execution order."""
        from graphopt.codegen.om_write import OmPartition

        by_name = {p["name"]: p for p in self.manifest["partitions"]}
        parts = []
        for name in self.execution_order:
            entry = by_name[name]
            model = self.models[name]
            parts.append(OmPartition(name, entry["device"], model, entry["inputs"], entry["outputs"],
                                     entry.get("providers"), entry.get("optimization_level"),
                                     entry.get("disabled_optimizers"),
                                     entry.get("prepack_weights", True)))
        return parts


def load_om(path: str | os.PathLike, *, defer_checks: bool = False) -> OmArtifact:
    """Load and verify an .om; any problem raises ArtifactError naming the file and the problem.

    `defer_checks=True` (the runtime's start-up) leaves out what only matters once a partition
    runs: the sha256 sums of the partition members, of the weights blobs and of the details
    (which a run never reads), and the parse of the partition models (`artifact.models` parses
    each when first asked for). The caller must
    pass `artifact.verify_checksums()` before it returns anything computed from them, and must
    not hand a partition to onnxruntime before checking its external references (the runtime
    reads them on the protobuf wire, om_refs, or parses each partition that
    `may_reference_files` with `artifact.models.parse`). Everything
    else (zip structure, member names and sizes, manifest, routing, the other members' sums) is
    checked before this returns.
    """
    path = os.fspath(path)
    try:
        return _load(path, defer_checks)
    except Malformed as exc:
        raise ArtifactError(f"{path}: {exc}") from None


def _load(path: str, defer: bool) -> OmArtifact:
    try:
        # A descriptor, not a file object (~10 µs more, several times that cold); non-blocking,
        # since opening a pipe would wait for a writer (a regular file ignores the flag).
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise Malformed(f"cannot read ({exc.strerror or exc})") from None
    # One handle for the sniff, the zip and, with weights blobs, every later read of them:
    # every open costs at start-up, and the path may name another file by then.
    try:
        file = OpenedFile(fd, path)  # closes fd when dropped
    except OSError as exc:
        os.close(fd)
        raise Malformed(f"cannot read ({exc.strerror or exc})") from None
    if not file.regular:
        file.close()
        raise Malformed("not a regular file (a folder, a pipe or a device); an .om is loaded "
                        "from a file, whose zip directory is read from its end")
    try:
        data = _read_all(fd, file.size) if file.size <= _READ_WHOLE_BYTES else None
    except OSError as exc:
        file.close()  # now, not when a caller drops the error, whose traceback holds it
        raise Malformed(f"cannot read ({exc.strerror or exc})") from None
    try:
        if data is not None:
            return _load_from(path, io.BytesIO(data), defer, file)
        with open(fd, "rb", closefd=False) as f:
            return _load_from(path, f, defer, file)
    except BaseException:
        file.close()  # now, not when a caller drops the error, whose traceback holds it
        raise


def _read_all(fd: int, size: int) -> bytes:
    """The `size` bytes of a file from its start (a short read, of a file that shrank, is
    returned as it is: the zip's own structure then fails to parse)."""
    pieces = []
    while size > 0:
        piece = os.read(fd, size)
        if not piece:
            break
        pieces.append(piece)
        size -= len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


# An artifact up to this size is read in one call, and the zip's directory and members are
# taken from memory: a small model's load would otherwise spend more on a dozen seeks and
# reads than on hashing. Past it, its bytes are mostly weights that stay on disk.
_READ_WHOLE_BYTES = 1 << 20


def _load_from(path: str, f, defer: bool, file: OpenedFile) -> OmArtifact:
    try:
        magic = f.read(4)
    except OSError as exc:
        raise Malformed(f"cannot read ({exc.strerror or exc})") from None
    if not magic.startswith(b"PK"):
        raise Malformed("not an .om artifact (not a zip archive)")
    try:
        zf = (isinstance(f, io.BytesIO) and plain_zip(f)) or zipfile.ZipFile(f)
    except (zipfile.BadZipFile, EOFError, ValueError):
        raise Malformed("truncated or corrupt zip archive (no readable central directory)") from None
    except NotImplementedError as exc:  # a corrupt "version needed to extract"
        raise Malformed(f"corrupt zip archive ({exc})") from None
    except OSError as exc:
        raise Malformed(f"cannot read ({exc.strerror or exc})") from None
    with zf:
        names = zf.namelist()
        # graphopt writes stored and deflated members only; another method (a flipped bit
        # away) would reach decompressors whose errors are their own.
        for info in zf.infolist():
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise Malformed(f"member {info.filename!r} uses zip compression method "
                                f"{info.compress_type}; graphopt writes stored or deflated members")
        # Refuse unsafe names before reading anything: this also protects anyone who unzips the file.
        for name in names:
            try:
                check_member_name(name)
            except ValueError as exc:
                raise Malformed(str(exc)) from None
        if len(set(names)) != len(names):
            raise Malformed("a member name appears twice (ambiguous, possibly tampered)")
        try:
            manifest = _read_manifest(zf)
        except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError,
                OSError) as exc:  # OSError: a corrupt header offset makes zipfile seek before 0
            raise Malformed(f"{MANIFEST_NAME} is corrupt ({exc})") from None
        check_manifest(manifest)
        order_profile_dims(manifest)
        listed = manifest["members"]
        for name in listed:
            try:
                check_member_name(name)
            except ValueError as exc:
                raise Malformed(f"manifest lists an {exc}") from None
        for name in names:
            if name != MANIFEST_NAME and name not in listed:
                raise Malformed(f"member {name!r} is not listed in the manifest (tampered?)")
        members = {name: _read_member(zf, name, listed[name]) for name in sorted(listed)
                   if not name.startswith(WEIGHTS_DIR)}
        spans = {name: _weights_span(zf, name, listed[name]) for name in sorted(listed)
                 if name.startswith(WEIGHTS_DIR)}
    # Deferred, the runtime hashes the partitions (beside onnxruntime's session creation when
    # they are large), and the details are hashed when first read (a run never reads them).
    deferred = set(_deferred_members(manifest)) if defer else set()
    for name in sorted(members):
        if name not in deferred:
            _check_sha256(name, members[name], listed[name])
    for part in manifest["partitions"]:
        if part["member"] not in members:
            raise Malformed(f"partition {part['name']!r} member {part['member']!r} is not a listed member")
    models = PartitionModels(path, manifest, members,
                             {name: size for name, (_, size) in spans.items()})
    if not defer:
        for part in manifest["partitions"]:
            models[part["name"]]  # noqa: B018 - parsed and checked now, kept for the caller
    _check_routing(manifest)
    artifact = OmArtifact(path=path, manifest=manifest, members=members, models=models,
                          spans=spans, verified=not defer, file=file if spans else None,
                          location=file.location)
    if not defer:
        artifact.verify_weights()
    return artifact


def _partition_members(manifest: dict) -> list[str]:
    return [part["member"] for part in manifest["partitions"]]


def _deferred_members(manifest: dict) -> list[str]:
    members = _partition_members(manifest)
    return members + [DETAILS_NAME] if manifest.get("details") == DETAILS_NAME else members


def is_om(path: str | os.PathLike) -> bool:
    """Whether `path` looks like an .om (zip with a graphopt manifest); checksums are not verified."""
    if _special(path):  # opening a pipe waits for a writer
        return False
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return False
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo(MANIFEST_NAME)
            if info.file_size > _MAX_MANIFEST_BYTES:
                return False
            manifest = json.loads(_inflated(zf, info).decode("utf-8"))
    except (OSError, KeyError, ValueError, EOFError, RuntimeError, NotImplementedError,
            zipfile.BadZipFile, zlib.error):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def looks_like_onnx(path: str | os.PathLike) -> bool:
    """Whether the file starts as a serialized ModelProto does: field 1 (ir_version, a
    varint), tag byte 0x08. An .onnx named .om is then told apart from a damaged artifact."""
    if _special(path):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x08"
    except OSError:
        return False


def _special(path: str | os.PathLike) -> bool:
    """Whether `path` is a pipe, a device or a socket (atomic.is_special_file)."""
    from graphopt.atomic import is_special_file  # on the failure paths only

    try:
        return is_special_file(os.fspath(path))
    except ValueError:  # a NUL in the path: the open that follows says so
        return False
