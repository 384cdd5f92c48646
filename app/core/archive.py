"""Reading the members of a zip file someone else made (projects, profiles)."""

from __future__ import annotations

import zipfile


class MemberTooLarge(ValueError):
    pass


def read_bounded(zf: zipfile.ZipFile, member: str, limit: int) -> bytes:
    """A member's bytes, refused once more than ``limit`` come out (whatever its header says)."""
    with zf.open(member) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise MemberTooLarge(f"{member} is larger than {limit:,} bytes uncompressed")
    return data
