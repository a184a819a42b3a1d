"""Trying to break the ENUM / SET labels (logged_labels.py: the TABLE_MAP's; catalog.py: the
shape's) on the real MariaDB, with both decoders, against what the server holds (the dump's
select, ``select_keys``): label lengths at the length-encoding bounds, more than 64 KiB of
labels, 2-byte ENUM indexes in wide character sets, the two forms of the ENUM / SET charset
metadata, collations, labels changed between rows events, and the labels no test drew.

A passing test is a behaviour that held or a bug fixed with it; ``xfail(strict=True)`` marks
a bug left: its reason says what goes wrong.
"""
from __future__ import annotations

import tempfile
import time

import pytest

from airflow_provider_dblog.engine.errors import SourceSetupError
from airflow_provider_dblog.engine.events import rows_of
from airflow_provider_dblog.engine.sources.base import Idle, RowChange, TxnEnd

from test_mes_break import LIB, MES, _history, _master, _raw, _read, _source

pytestmark = pytest.mark.usefixtures("servers")


def _case(creates: list[str], statements: list[str], setup=()) -> tuple[list, list, dict]:
    """Both decoders' items from ``statements`` (table t), and the server's rows of t as the
    dump selects them (``select_keys`` of the keys the tail carried), by key."""
    with _history(creates, statements, setup) as (db, resume, end, _):
        raw = _raw(db, ["t"], tempfile.mkdtemp())
        library, compiled = _read(raw, LIB, 7601, resume, end), _read(raw, MES, 7602, resume, end)
        src = _source(raw, LIB)
        try:
            schema = src.table_schema(f"{db}.t")
            keys = {e.key for e in library if hasattr(e, "op")}
            dump = {tuple(r[k] for k in schema.key): r for r in rows_of(schema, src.select_keys(schema, keys))}
        finally:
            src.close()
    return library, compiled, dump


def _events(items: list) -> list:
    return [i for i in items if hasattr(i, "op")]


def _not_events(items: list) -> list:
    return [i for i in items if type(i) is not tuple and not hasattr(i, "op")]


def _carried_as_dumped(creates: list[str], inserts: list[str], setup=()) -> list[dict]:
    """Rows inserted (one event each, keys distinct): both decoders carry them alike, break
    nothing, hold nothing, and each row is the dump's. The rows carried."""
    library, compiled, dump = _case(creates, inserts, setup)
    assert compiled == library
    assert not _not_events(library), _not_events(library)
    events = _events(library)
    assert events and not any(e.error for e in events)
    assert {e.key: e.after for e in events} == dump
    return [e.after for e in events]


def _labels(labels) -> str:
    return ", ".join("'" + v.replace("\\", "\\\\").replace("'", "''") + "'" for v in labels)


def _numbered(count: int, length: int, ch: str = "x") -> list[str]:
    return [ch * (length - 4) + f"{i:04d}" for i in range(count)]


# -- what held --------------------------------------------------------------------------------
_BOUNDS = [("\u00ff" * n)[:n] for n in range(247, 256)]           # latin1: 247..255 bytes
_WIDE_BOUNDS = ["\u00e9" * 125, "\u00e9" * 125 + "a", "\u00e9" * 126, "\u00e9" * 126 + "a",
                "\U0001d11e" * 255]                                  # utf8mb4: 250..253 and 1020 bytes
HELD = {
    "label_lengths_at_the_length_encoding_bounds": (
        [f"CREATE TABLE t (id INT PRIMARY KEY, a ENUM({_labels(_BOUNDS)}) CHARACTER SET latin1, "
         f"b SET({_labels(_WIDE_BOUNDS)}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, "
         f"c ENUM({_labels(_numbered(251, 5))}), d ENUM({_labels(_numbered(252, 5))}))"],
        [f"INSERT INTO t VALUES ({i}, {i % 9 + 1}, {1 << (i % 5)}, {250 + i % 2}, {i * 40 % 252 + 1})" for i in range(9)]
        + ["INSERT INTO t VALUES (9, 9, 31, 251, 252)"]),
    "more_than_64_kib_of_labels": (
        ["CREATE TABLE t (id INT PRIMARY KEY, " + ", ".join(
            f"e{j} ENUM({_labels(_numbered(200, 255, 'x'))}) CHARACTER SET latin1" for j in range(4)) + ")"],
        ["INSERT INTO t VALUES (1, 1, 100, 199, 200)"]),
    "two_byte_indexes_in_wide_character_sets": (
        ["CREATE TABLE t (id INT PRIMARY KEY, " + ", ".join(
            f"e{cs} ENUM({_labels(_numbered(300, 6, chr(0xe9)))}) CHARACTER SET {cs}"
            for cs in ("ucs2", "utf16le", "latin1", "cp1251")) + f", s SET({_labels(_numbered(64, 6, chr(0xdf)))}) "
         "CHARACTER SET ucs2)"],
        ["INSERT INTO t VALUES (1, 256, 257, 299, 300, 1 << 63), (2, 1, 255, 256, 0, 0)"]),
    "enum_and_set_columns_each_in_its_character_set": (   # ENUM_AND_SET_COLUMN_CHARSET
        ["CREATE TABLE t (id INT PRIMARY KEY, e1 ENUM('é','a') CHARACTER SET latin1, v1 VARCHAR(5) CHARACTER SET ucs2, "
         "s1 SET('é','ß') CHARACTER SET utf16le, e2 ENUM('中','a') CHARACTER SET utf8mb4, s2 SET('к','b') CHARACTER SET "
         "cp1251, v2 TEXT CHARACTER SET latin2, e3 ENUM('ß','q') CHARACTER SET ucs2, s3 SET('é') CHARACTER SET latin1)"],
        ["INSERT INTO t VALUES (1, 'é', 'ä', 'é,ß', '中', 'к,b', 'ą', 'ß', 'é'), (2, 'a', 'x', 'ß', 'a', 'b', 'y', 'q', '')"]),
    "enum_and_set_columns_mostly_in_one_character_set": (   # ENUM_AND_SET_DEFAULT_CHARSET
        ["CREATE TABLE t (id INT PRIMARY KEY, e1 ENUM('é','a') CHARACTER SET latin1, e2 ENUM('ÿ') CHARACTER SET latin1, "
         "s1 SET('é','ß') CHARACTER SET utf16le, e3 ENUM('ß','q') CHARACTER SET latin1, s2 SET('Á','b') CHARACTER SET latin1)"],
        ["INSERT INTO t VALUES (1, 'é', 'ÿ', 'é,ß', 'ß', 'Á,b'), (2, 'a', 1, 'ß', 'q', 'b')"]),
    "case_and_accent_insensitive_collations": (
        ["CREATE TABLE t (id INT PRIMARY KEY, e ENUM('a','B') CHARACTER SET latin1, f ENUM('é','x') CHARACTER SET "
         "utf8mb4 COLLATE utf8mb4_uca1400_ai_ci, s SET('Ä','b') CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci)"],
        ["INSERT INTO t VALUES (1, 'A', 'e', 'ä,B'), (2, 'b', 'E', 'a'), (3, 'zzz', 'É', 'B,ä')"]),
    "a_bad_value_an_empty_label_and_an_empty_set": (
        ["CREATE TABLE t (id INT PRIMARY KEY, e ENUM('', 'a'), s SET('x', 'y'))"],
        ["INSERT INTO t VALUES (1, 'zzz', ''), (2, '', NULL), (3, 'a', 'y,x'), (4, NULL, 'zzz')"]),
}


@pytest.mark.parametrize("name", list(HELD))
def test_labels_read_as_the_server_holds_them(name):
    _carried_as_dumped(*HELD[name])


def _live(creates: list[str], steps: list[str], decoder: str, tables=("t",)) -> list:
    """The tail's items (``decoder``) while ``steps`` run, each read to its end before the
    next runs (a write to the uncaptured table m after each)."""
    with _history(creates + ["CREATE TABLE m (id INT AUTO_INCREMENT PRIMARY KEY)"], []) as (db, resume, _, cur):
        source = _source(_raw(db, list(tables), tempfile.mkdtemp()), decoder)
        deadline = time.monotonic() + 30
        read = source.read_log(resume, lambda: time.monotonic() > deadline, 7603)
        items = []
        try:
            for st in steps:
                cur.execute(st)
                cur.execute("INSERT INTO m VALUES ()")
                _, end = _master(cur)
                for item in read:
                    if isinstance(item, RowChange):
                        items.append(item.event)
                    elif isinstance(item, TxnEnd):
                        if (item.pos.log, item.pos.offset) >= end:
                            break
                    elif not isinstance(item, Idle):
                        items.append(item)
                else:
                    raise AssertionError(f"{decoder}: {end} not reached")
        finally:
            read.close()
            source.close()
    return items


@pytest.mark.parametrize("decoder", [LIB, MES])
def test_labels_changed_between_rows_events_read_as_each_row_was_written(decoder):
    """A label added in the middle, one renamed (case, under a _bin collation), a SET member
    added in the middle, a label moved to the front: each row reads with its own labels."""
    items = _live(["CREATE TABLE t (id INT PRIMARY KEY, e ENUM('a','b') CHARACTER SET latin1, s SET('x','y'))"],
                  ["INSERT INTO t VALUES (1, 'b', 'y')", "ALTER TABLE t MODIFY e ENUM('a','é','b') CHARACTER SET latin1",
                   "INSERT INTO t VALUES (2, 'b', 'x')",
                   "ALTER TABLE t MODIFY e ENUM('A','é','b') CHARACTER SET latin1 COLLATE latin1_bin",
                   "INSERT INTO t VALUES (3, 'A', 'x,y')", "ALTER TABLE t MODIFY s SET('x','z','y')",
                   "UPDATE t SET e = 'é', s = 'z,y' WHERE id = 3",
                   "ALTER TABLE t MODIFY e ENUM('c','A','é','b') CHARACTER SET latin1 COLLATE latin1_bin",
                   "UPDATE t SET e = 'c' WHERE id = 2"], decoder)
    assert [type(i).__name__ for i in items if not hasattr(i, "op")] == ["SchemaChange"] * 4
    assert [(e.before, e.after) for e in _events(items)] == [
        (None, {"id": 1, "e": "b", "s": "y"}), (None, {"id": 2, "e": "b", "s": "x"}),
        (None, {"id": 3, "e": "A", "s": "x,y"}),
        ({"id": 3, "e": "A", "s": "x,y"}, {"id": 3, "e": "é", "s": "z,y"}),
        ({"id": 2, "e": "b", "s": "x"}, {"id": 2, "e": "c", "s": "x"})]


# -- bugs found, fixed ------------------------------------------------------------------------
def test_labels_with_a_backslash_nul_lf_or_cr_are_the_labels_written():
    """information_schema prints a label's backslash, NUL, LF and CR escaped (\\\\, \\0, \\n,
    \\r); the catalog took the escapes as the label (types.set_members): every rows event of
    such a table broke it, with either decoder, and a dump by keys found no row of such an
    ENUM key (its label was not one of the column's: silently absent)."""
    labels = ["a\\b", "x\ny", "c\rd", "n\0", "t\tz", "\\0", "\\", "q'\\'"]
    members = labels[:6]
    rows = _carried_as_dumped(
        [f"CREATE TABLE t (k ENUM({_labels(labels)}) CHARACTER SET utf8mb4 PRIMARY KEY, "
         f"s SET({_labels(members)}) CHARACTER SET latin1, e ENUM({_labels(labels)}) CHARACTER SET ucs2)"],
        [f"INSERT INTO t VALUES ({i + 1}, {(1 << (i % 6)) | 1}, {len(labels) - i})" for i in range(len(labels))])
    assert [(r["k"], r["s"], r["e"]) for r in rows] == [
        (lab, ",".join(dict.fromkeys([members[0], members[i % 6]])), labels[-1 - i]) for i, lab in enumerate(labels)]


def test_a_set_with_a_member_twice_reads_as_the_server_prints_it():
    """MariaDB takes SET('a','a','b') outside strict mode (a Note): the library decoder made a
    Python set of the members' texts, so bit 0 or bit 1 alone came out 'a,a' where the server,
    the dump and the other decoder say 'a' (logged_labels.SetMember keeps the bit)."""
    rows = _carried_as_dumped(["CREATE TABLE t (id INT PRIMARY KEY, s SET('a','a','b'), e ENUM('x','x'))"],
                              ["INSERT INTO t VALUES (1, 1, 1), (2, 2, 2), (3, 3, 1), (4, 6, 2), (5, 0, 1)"])
    assert [r["s"] for r in rows] == ["a", "a", "a,a", "a,b", ""]


def test_character_set_binary_labels_read_as_the_dump_reads_them():
    """ENUM / SET ... CHARACTER SET binary: the labels were decoded as latin-1 ('é' as 'Ã©'),
    never the catalog's, and every rows event broke the table. The dump reads them as UTF-8,
    each byte that is not a '?' (CAST AS CHAR); the catalog prints a character outside the
    BMP as four '?', read from the server then (catalog._true_labels)."""
    rows = _carried_as_dumped(
        ["CREATE TABLE t (id INT PRIMARY KEY, e ENUM('a', x'ff', 'é', x'e28241', '𝄞', x'00', 'B') CHARACTER SET binary, "
         "s SET('é', x'c3', '𝄞', '?') CHARACTER SET binary)"],
        [f"INSERT INTO t VALUES ({i}, {i}, {(1 << (i % 4)) | 4})" for i in range(1, 8)])
    assert [r["e"] for r in rows] == ["a", "?", "é", "??A", "𝄞", "\0", "B"]
    assert [r["s"] for r in rows] == ["?,𝄞", "𝄞", "𝄞,?", "é,𝄞", "?,𝄞", "𝄞", "𝄞,?"]


def test_labels_of_a_uca1400_collation_read_in_its_character_set():
    """mysql-replication 1.0.17 knows no UCA 14.0.0 collation (MariaDB 10.10+, ids 2048 and
    up): a ucs2 column's labels were decoded as UTF-8 ('\\x00a') and every rows event broke
    the table, with either decoder."""
    rows = _carried_as_dumped(
        ["CREATE TABLE t (id INT PRIMARY KEY, e ENUM('a', 'é', 'ß') CHARACTER SET ucs2 COLLATE ucs2_uca1400_ai_ci, "
         "s SET('x', 'ü') CHARACTER SET ucs2 COLLATE ucs2_uca1400_as_cs, "
         "m ENUM('é', '中') CHARACTER SET utf8mb3 COLLATE utf8mb3_uca1400_ai_ci)"],
        ["INSERT INTO t VALUES (1, 'a', 'x,ü', 'é'), (2, 'é', 'ü', '中'), (3, 'ß', '', 'é')"])
    assert [tuple(r.values()) for r in rows] == [(1, "a", "x,ü", "é"), (2, "é", "ü", "中"), (3, "ß", "", "é")]


@pytest.mark.parametrize("decoder", [LIB, MES])
def test_a_label_the_catalog_cannot_print_as_utf8_breaks_only_its_table(decoder):
    """MariaDB's utf8mb4 takes an encoded surrogate (ED A0 80) as a label; information_schema
    and SHOW CREATE TABLE then give bytes pymysql cannot decode: the catalog read after the
    ALTER raised UnicodeDecodeError, and it stopped the tail. The table breaks; the other
    table's rows and its own ALTER are read on."""
    items = _live(["CREATE TABLE t (id INT PRIMARY KEY, e ENUM('a') CHARACTER SET utf8mb4)",
                   "CREATE TABLE u (id INT PRIMARY KEY, e ENUM('a', 'b'))"],
                  ["INSERT INTO t VALUES (1, 'a')", "ALTER TABLE t MODIFY e ENUM('a', x'eda080') CHARACTER SET utf8mb4",
                   "INSERT INTO t VALUES (2, 2)", "INSERT INTO u VALUES (1, 'b')",
                   "ALTER TABLE u MODIFY e ENUM('a', 'b', 'c')", "INSERT INTO u VALUES (2, 'c')"],
                  decoder, tables=("t", "u"))
    assert [type(i).__name__ for i in items] == ["Event", "TableBroken", "Event", "SchemaChange", "Event"]
    assert "not UTF-8" in items[1].why
    assert [e.after for e in _events(items)][1:] == [{"id": 1, "e": "b"}, {"id": 2, "e": "c"}]


@pytest.mark.parametrize("labels", ["'x', 'x', 'y'", "x'81', x'83', 'a'"])
def test_a_key_column_with_labels_that_read_alike_is_refused(labels):
    """A key ENUM with a label twice (outside strict mode, a Note), or two labels read alike
    (cp1250 has no character for 0x81 nor 0x83: both '?'): two rows that differ only in
    which they hold were carried with the same key (the second insert overwrote the first
    in the target, and a delete of one deleted both), and a dump by keys found neither."""
    creates = [f"CREATE TABLE t (id INT, k ENUM({labels}) CHARACTER SET cp1250 NOT NULL, PRIMARY KEY (k, id))"]
    with _history(creates, []) as (db, _, _, _):
        src = _source(_raw(db, ["t"], tempfile.mkdtemp()), LIB)
        try:
            with pytest.raises(SourceSetupError, match="labels that read alike"):
                src.table_schema(f"{db}.t")
        finally:
            src.close()
    items = _live(["CREATE TABLE t (id INT, k ENUM('x', 'y') NOT NULL, PRIMARY KEY (k, id))"],
                  ["INSERT INTO t VALUES (1, 1)", "ALTER TABLE t MODIFY k ENUM('x', 'y', 'x') NOT NULL",
                   "INSERT INTO t VALUES (1, 3)"], MES)
    assert [type(i).__name__ for i in items] == ["Event", "TableBroken"] and "read alike" in items[1].why


def test_euckr_text_of_its_cp949_extension_reads_as_the_server():
    """MariaDB's euckr is CP949 (Python's euc_kr lacks 8,822 of its characters, '갂' 0x8141):
    such a value was held (not carried) and such a label broke its table."""
    rows = _carried_as_dumped(
        ["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(4) CHARACTER SET euckr, e ENUM('갂', '한') CHARACTER SET euckr)"],
        ["INSERT INTO t VALUES (1, '갂똠', '갂'), (2, '한글', '한')"])
    assert [(r["v"], r["e"]) for r in rows] == [("갂똠", "갂"), ("한글", "한")]


# -- bugs found, left -------------------------------------------------------------------------
@pytest.mark.xfail(strict=True, reason="Python's codecs of sjis (0x815F), ujis (0xA1C0), eucjpms (0xA1C1 ... 8 "
                   "characters) and big5 (0xA15A ... 7) decode a valid character otherwise than the server: the tail "
                   "carries '＼' / '〜' / '╴' where the dump reads '\\' / '～' / U+FFFD, silently (and such a label "
                   "breaks its table); Python has no eucJP-ms (2,069 of its characters are held). A fix: the server's "
                   "own decode tables for multi-byte character sets, as types.py has for single-byte ones")
def test_multibyte_text_python_decodes_otherwise_reads_as_the_server():
    _carried_as_dumped(
        ["CREATE TABLE t (id INT PRIMARY KEY, s VARCHAR(4) CHARACTER SET sjis, u VARCHAR(4) CHARACTER SET ujis, "
         "j VARCHAR(4) CHARACTER SET eucjpms, b VARCHAR(4) CHARACTER SET big5)"],
        ["INSERT INTO t VALUES (1, x'815f', x'a1c0', x'a1c1', x'a1fe')"])


@pytest.mark.xfail(strict=True, reason="an ENUM key with the label '' reads alike with its bad value (index 0, "
                   "written outside strict mode or by INSERT IGNORE), also ''. Two rows that differ only in that carry "
                   "the same key (one row in the target; a delete of one deletes both); the table is not refused "
                   "(refusing every ENUM key with a '' label would refuse tables that never hold a bad value)")
def test_an_enum_key_with_the_empty_label_and_a_bad_value():
    creates = ["CREATE TABLE t (id INT, k ENUM('', 'a') NOT NULL, PRIMARY KEY (k, id))"]
    try:
        library, compiled, _ = _case(creates, ["INSERT INTO t VALUES (1, 'zzz'), (1, '')"])
    except SourceSetupError:
        return
    assert compiled == library
    assert len({e.key for e in _events(library)}) == 2 or any(e.error for e in _events(library))


@pytest.mark.xfail(strict=True, reason="information_schema prints a DEFAULT's character outside the BMP as '?': "
                   "captured.catalog_past_statement finds the added column's DEFAULT '𝄞' is not the catalog's '?' "
                   "and breaks the table ('the catalog is already past the ALTER TABLE'), though nothing changed "
                   "since; a fix needs the true default text from the server (prints_as alone would let a default "
                   "changed again meanwhile through)")
@pytest.mark.parametrize("column", ["e ENUM('𝄞', 'c') CHARACTER SET utf8mb4 NOT NULL DEFAULT '𝄞'",
                                    "v VARCHAR(3) CHARACTER SET utf8mb4 NOT NULL DEFAULT 'a𝄞'"])
def test_a_column_added_with_a_default_outside_the_bmp_does_not_break_the_table(column):
    items = _live(["CREATE TABLE t (id INT PRIMARY KEY)"],
                  ["INSERT INTO t VALUES (1)", f"ALTER TABLE t ADD COLUMN {column}", "INSERT INTO t (id) VALUES (2)"], MES)
    assert [type(i).__name__ for i in items] == ["Event", "SchemaChange", "Event"], items
