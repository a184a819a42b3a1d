"""The ENUM / SET labels of a TABLE_MAP event as the server logged them.

mysql-replication 1.0.17 reads each label's length in the TABLE_MAP's optional metadata as
a 7-bit varint where the server writes a length-encoded integer: a label of 128 bytes or
more is misread, and the event's parse fails (the tail stops). It decodes each label as
UTF-8, and one it cannot decode becomes '': a latin1 'é' (one byte E9) or any utf16le label
is then never the label the catalog gives, and the shape check
(captured.logged_shape_problem) would break the table. So ``install`` replaces that one
reading method with one that reads the lengths as written and keeps each label's bytes,
and ``true_labels`` decodes them in the column's character set, as the server does: both
decoders compare these labels, and the library decodes ENUM / SET values of rows events
with them. No Spark and no Airflow here.
"""
from __future__ import annotations

import codecs
from typing import Any

from .types import codec_of

ENUM, SET = 247, 248   # a column's real type, as the library reads it from the STRING type's metadata


class LoggedLabel(str):
    """A label as mysql-replication gives it (its bytes as UTF-8, '' if they are not),
    with the bytes as logged (``raw``)."""
    raw: bytes


def _read_type_values(self, length: int) -> list[list[LoggedLabel]]:
    """TableMapEvent's reading of an ENUM_STR_VALUE / SET_STR_VALUE field: per column a
    count, then each label's length and bytes, every number length-encoded."""
    columns, until = [], self.packet.read_bytes + length
    while self.packet.read_bytes < until:
        labels = []
        for _ in range(self.packet.read_length_coded_binary()):
            raw = bytes(self.packet.read(self.packet.read_length_coded_binary()))
            try:
                label = LoggedLabel(raw.decode())
            except UnicodeDecodeError:
                label = LoggedLabel("")
            label.raw = raw
            labels.append(label)
        columns.append(labels)
    return columns


def install() -> None:
    """Have mysql-replication read the labels as written (idempotent; imports the library)."""
    from pymysqlreplication.row_event import TableMapEvent
    TableMapEvent._read_type_values = _read_type_values


def true_labels(ev: Any) -> None:
    """Put on a TABLE_MAP event parsed by mysql-replication (its ``columns``) the ENUM / SET
    labels as logged, each decoded in its column's character set. A label that does not
    decode keeps the library's text: the shape check then names the column. SET members
    carry their bit (SetMember): two members alike (MariaDB takes a SET with a member twice
    outside strict mode) stay two in the set the library makes of a value."""
    collations = iter(getattr(getattr(ev, "optional_metadata", None), "enum_and_set_collation_list", None) or ())
    for c in ev.columns:
        if c.type not in (ENUM, SET):
            continue
        charset = _charset(c, next(collations, None))
        if c.type == ENUM and c.enum_values:
            c.enum_values = [""] + _decoded(charset, c.enum_values[1:])
        elif c.type == SET and c.set_values:
            c.set_values = [SetMember.of(m, bit) for bit, m in enumerate(_decoded(charset, c.set_values))]


class SetMember(str):
    """A SET member as the library puts it in a value's set: equal to its text, but two
    members of the same text and other bits are two (convert._text orders them by ``bit``)."""
    bit: int

    @classmethod
    def of(cls, text: str, bit: int) -> "SetMember":
        m = cls(text)
        m.bit = bit
        return m

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and str.__eq__(self, other) and getattr(other, "bit", self.bit) == self.bit

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__


# MariaDB's UCA 14.0.0 collations (10.10+; mysql-replication 1.0.17 knows none of them): the
# character set by the collation id's range
_UCA1400 = {8: "utf8mb3", 9: "utf8mb4", 10: "ucs2", 11: "utf16", 12: "utf32"}


def _charset(column: Any, collation_id: Any) -> str:
    collation = getattr(column, "collation_name", None)
    if collation:
        return collation.split("_")[0]
    if isinstance(collation_id, int) and collation_id >> 8 in _UCA1400:
        return _UCA1400[collation_id >> 8]
    return "utf8mb4"


def _question_marks(e: UnicodeDecodeError) -> tuple[str, int]:
    return "?" * (e.end - e.start), e.end


codecs.register_error("dblog_each_byte_a_question_mark", _question_marks)


def _decoded(charset: str, labels: list) -> list[str]:
    try:
        if charset == "binary":   # as the server converts it (CAST AS CHAR, the dump): each bad byte a '?'
            return [label.raw.decode("utf-8", "dblog_each_byte_a_question_mark") for label in labels]
        codec = codecs.lookup(codec_of(charset)).name
        return [label.raw.decode(codec) for label in labels]
    except (AttributeError, LookupError, UnicodeDecodeError, ValueError):
        return list(labels)
