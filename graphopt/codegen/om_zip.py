"""The zip directory of a small .om held in memory, read with a few struct calls when it has
the plain form graphopt writes; zipfile reads any other."""

from __future__ import annotations

import io
import struct
from typing import NamedTuple

# zip's end of central directory record (22 bytes without a comment) and central directory
# file header (46 bytes before the name), little-endian as the format defines them.
_END = struct.Struct("<4s4H2LH")
_ENTRY = struct.Struct("<4s6H3L5H2L")
_END_SIGNATURE, _ENTRY_SIGNATURE = b"PK\x05\x06", b"PK\x01\x02"
_ZIP64_LOCATOR = b"PK\x06\x07"  # zipfile looks for it right before the end record
_LOCAL_HEADER_BYTES = 30
_UTF8_NAME = 0x800  # the only general-purpose flag graphopt's members carry
_MAX_EXTRACT_VERSION = 63  # zipfile refuses anything newer
_STORED = 0


class Member(NamedTuple):
    """What the loader reads of a member, under zipfile.ZipInfo's names."""

    filename: str
    compress_type: int
    CRC: int
    file_size: int
    header_offset: int


class MemoryZip:
    """zipfile.ZipFile's interface as far as the loader uses it for stored members (their
    directory; the loader reads their bytes from `fp` itself), over what `plain_zip` found."""

    def __init__(self, fp: io.BytesIO, members: list[Member]) -> None:
        self.fp = fp
        self._members = members
        self._by_name = {member.filename: member for member in members}  # the last one wins

    def namelist(self) -> list[str]:
        return [member.filename for member in self._members]

    def infolist(self) -> list[Member]:
        return list(self._members)

    def getinfo(self, name: str) -> Member:
        return self._by_name[name]

    def __enter__(self) -> MemoryZip:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def plain_zip(fp: io.BytesIO) -> MemoryZip | None:
    """The archive in `fp` when it has the form graphopt writes, each member stored whole (no
    comment, no zip64 records, nothing before the first member, no flags but UTF-8 names, no
    NUL in a name, no extra field in the directory: a weights blob's alignment padding makes
    one, and a small artifact has no blob); None for anything else, which zipfile then reads,
    accepts or refuses as it always did. This costs a few struct calls where zipfile builds a
    ZipInfo per member, on the start-up path of every small artifact. The bytes are parsed
    through a view of getvalue(), the very bytes fp was made from: getbuffer would copy a
    buffer fp shares (a fresh allocation of the file's size, whose page faults cost more than
    the parse)."""
    with memoryview(fp.getvalue()) as view:
        return _plain_zip(fp, view)


def _plain_zip(fp: io.BytesIO, data: memoryview) -> MemoryZip | None:
    size = len(data)
    if size < _END.size:
        return None
    (signature, disk, cd_disk, disk_entries, entries, cd_size, cd_offset,
     comment_length) = _END.unpack_from(data, size - _END.size)
    if (signature != _END_SIGNATURE or disk or cd_disk or disk_entries != entries
            or comment_length or cd_offset + cd_size != size - _END.size
            or (size >= _END.size + 20
                and data[size - _END.size - 20:size - _END.size - 16] == _ZIP64_LOCATOR)):
        return None
    members = []
    at = cd_offset
    for _ in range(entries):
        if at + _ENTRY.size > cd_offset + cd_size:
            return None
        (signature, _, version, flags, method, _, _, crc, compressed, file_size, name_length,
         extra_length, comment_length, _, _, _, header_offset) = _ENTRY.unpack_from(data, at)
        name_start = at + _ENTRY.size
        at = name_start + name_length + extra_length + comment_length
        if (signature != _ENTRY_SIGNATURE or version > _MAX_EXTRACT_VERSION
                or extra_length or comment_length  # zipfile parses an extra field's records
                or flags & ~_UTF8_NAME or method != _STORED or compressed != file_size
                or 0xFFFFFFFF in (compressed, file_size, header_offset)
                or header_offset + _LOCAL_HEADER_BYTES > cd_offset or at > cd_offset + cd_size):
            return None
        raw_name = bytes(data[name_start:name_start + name_length])
        try:  # zipfile's cp437 is ASCII below 0x80, and its codec costs an import
            name = raw_name.decode("utf-8" if flags & _UTF8_NAME else "ascii")
        except UnicodeDecodeError:
            if flags & _UTF8_NAME:
                return None
            name = raw_name.decode("cp437")
        if "\x00" in name:  # zipfile would cut the name there
            return None
        members.append(Member(name, method, crc, file_size, header_offset))
    if at != cd_offset + cd_size:
        return None
    return MemoryZip(fp, members)
