"""The zip directory of a small .om read from memory (om_zip): what zipfile reads for the form
graphopt writes, and a hand-back to zipfile for any other."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from test_om_deferred import W, matmul_model
from test_om_wire import _blob_artifact

import graphopt
from graphopt.codegen import OmPartition, write_om
from graphopt.codegen.om_zip import plain_zip
from graphopt.errors import ArtifactError


def _directory(archive: bytes) -> list[tuple]:
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        return [(i.filename, i.compress_type, i.CRC, i.file_size, i.header_offset)
                for i in zf.infolist()]


@pytest.fixture
def small_om(tmp_path):
    path = tmp_path / "model.om"
    write_om(path, [OmPartition("p0", "cpu", matmul_model())], pass_log=[{"pass": "P"}])
    return path


def _zip64_headers(path, out) -> bytes:
    """The artifact with zip64 local headers, as zipfile writes a member it is told may grow
    past 4 GiB (the central directory stays plain)."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            with src.open(info) as data, dst.open(info, "w", force_zip64=True) as sink:
                sink.write(data.read())
    return out.read_bytes()


def test_written_artifacts_read_as_zipfile_reads_them(small_om, tmp_path):
    for archive in (small_om.read_bytes(), _zip64_headers(small_om, tmp_path / "zip64.om")):
        found = plain_zip(io.BytesIO(archive))
        assert found is not None
        assert [tuple(member) for member in found.infolist()] == _directory(archive)
        assert found.namelist() == [name for name, *_ in _directory(archive)]
    x = np.ones((1, 64), np.float32)
    np.testing.assert_allclose(graphopt.load(tmp_path / "zip64.om").run({"X": x})["Y"], x @ W,
                               rtol=1e-5)
    # A weights blob's alignment padding is an extra field, whose records zipfile checks: such
    # an artifact (over 1 MiB, so read from its file anyway) goes to zipfile.
    blob_path, _ = _blob_artifact(tmp_path)
    assert plain_zip(io.BytesIO(blob_path.read_bytes())) is None


def _rewritten(path, out, **options) -> bytes:
    """The artifact at `path` copied member by member into a zip written with `options`."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            info.compress_type = options.get("compression", info.compress_type)
            dst.writestr(info, data)
        dst.comment = options.get("comment", b"")
    return out.read_bytes()


@pytest.mark.parametrize("form", ["comment", "deflated", "prefix", "flags", "nul"])
def test_other_forms_go_to_zipfile(small_om, tmp_path, form):
    out = tmp_path / f"{form}.om"
    if form == "comment":
        archive = _rewritten(small_om, out, comment=b"hello")
    elif form == "deflated":
        archive = _rewritten(small_om, out, compression=zipfile.ZIP_DEFLATED)
    elif form == "prefix":  # data before the first member, as a self-extracting archive has
        archive = b"#!/bin/sh\n" + small_om.read_bytes()
    else:
        archive = bytearray(small_om.read_bytes())
        entry = archive.index(b"PK\x01\x02")
        if form == "flags":
            archive[entry + 8] |= 0x08  # a data descriptor follows the member
        else:
            archive[archive.index(b"manifest.json", entry) + 4] = 0
        archive = bytes(archive)
    assert plain_zip(io.BytesIO(archive)) is None
    if form in ("comment", "deflated"):  # forms zipfile reads: the artifact loads as before
        out.write_bytes(archive)
        x = np.ones((1, 64), np.float32)
        np.testing.assert_allclose(graphopt.load(out).run({"X": x})["Y"], x @ W, rtol=1e-5)


def _structure(archive: bytes) -> list[int]:
    """Where the zip's structure lies: every header's fixed fields and name (not a weights
    blob's alignment padding, an extra field whose records zipfile checks) and the end record."""
    spans = [(offset, offset + 30 + len(name)) for name, *_, offset in _directory(archive)]
    at = archive.index(b"PK\x01\x02")
    while archive.startswith(b"PK\x01\x02", at):
        name, extra, comment = (int.from_bytes(archive[at + k:at + k + 2], "little")
                                for k in (28, 30, 32))
        spans.append((at, at + 46 + name))
        at += 46 + name + extra + comment
    spans.append((len(archive) - 22, len(archive)))
    return [at for start, end in spans for at in range(start, end)]


@pytest.mark.parametrize("which", ["small", "blob"])
def test_every_byte_of_the_zip_structure_changed_reads_as_zipfile_or_not_at_all(
        small_om, tmp_path, which):
    """Each byte of the headers and the end record flipped, XORed with 0x80, zeroed and set to
    0xFF: plain_zip hands the archive to zipfile, or reads exactly what zipfile reads; and the
    load refuses it with an ArtifactError naming the file, or computes what the original does.
    The small artifact is read from memory, the one with a weights blob (over 1 MiB) from its
    file, by zipfile."""
    if which == "small":
        archive, x = small_om.read_bytes(), np.ones((1, 64), np.float32)
        want = x @ W
    else:
        blob_path, (w1, bias, w2) = _blob_artifact(tmp_path)
        archive, x = blob_path.read_bytes(), np.ones((1, 512), np.float32)
        want = (x @ w1 + bias) @ w2
    path = tmp_path / "mutant.om"
    read = refused = 0
    for at in _structure(archive):
        for value in {archive[at] ^ 0x01, archive[at] ^ 0x80, 0x00, 0xFF} - {archive[at]}:
            mutant = archive[:at] + bytes((value,)) + archive[at + 1:]
            found = plain_zip(io.BytesIO(mutant))
            if found is not None:
                read += 1
                assert [tuple(member) for member in found.infolist()] == _directory(mutant)
            path.write_bytes(mutant)
            try:
                y = graphopt.load(path).run({"X": x})["Y"]
            except ArtifactError as exc:
                refused += 1
                assert str(path) in str(exc)
            else:
                np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-3)
    assert refused and (read or which == "blob")  # the test sees both outcomes
