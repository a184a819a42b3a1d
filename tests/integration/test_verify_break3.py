"""Key lists (issue 29, round 3), real tail, apply and verify: keys matched by value (keys.value_keys),
requested keys canonicalized by the source (canonical_keys), tables verified again after a change of shape.

Generated, holding on a PostgreSQL and a Delta target (key-list dumps keep every row; verify --keys --repair
repairs): MariaDB TIME(0..6) keys beside an int or a case-insensitive PAD SPACE text, negative, past 24 h, in
other spellings (H:M:S, D HH:MM:SS, HHMMSS, fractions padded or trimmed, another case, trailing spaces);
PostgreSQL interval keys (months, days, signed fields) in composite keys, in units, H:M:S, ISO 8601, verbose
spellings, also under a writer changing each key's text; uuid, timestamptz, numeric(12,4), bytea, citext,
macaddr, time, cidr keys in other texts. Bugs found, each fixed in stop 38 (their tests pass):
A. inet host keys: a key-list dump, even of the source's own text, deleted the row from a PostgreSQL
   target (canonical_keys printed '10.0.0.1/32', the reads abbrev() '10.0.0.1'): canonical_keys now
   prints through the dump's own read expression (column_types.read_expr);
B. interval(3) / interval day to second keys were not matched by value (keys.by_value: any interval);
C. jsonb and array keys ({"a": 1.0} / {"a": 1.00}, {1.5} / {1.50}, {-0} / {0}, interval[]): a key-list
   dump of another text of a held key deleted its row: the source's own = now decides before a
   requested key is taken for deleted (Source.equal_keys, reconcile's equal_keys);
D. raise_if_differs named a table repaired beside one changing shape in every attempt as differing;
E. MariaDB TIME keys canonicalized by a CAST that reads texts in part ('2 days' is 00:00:02) or drops a
   fraction the column cannot hold: such a key now stays as given (no row's key: its delete is exact).
"""
from __future__ import annotations

import ipaddress
import random

import pytest

from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import target_table_name
from test_verify import Background
from test_verify_break import MARIADB, POSTGRES, _create, _replicated, _target_sql, _verify

DAY_US = 86_400_000_000


def _replicas(src_db, make_cdc, tables: dict, lake: bool = False, create=_create):   # (and on a Delta "lake")
    cdc = make_cdc(list(tables), lake="delta" if lake else False)
    create(src_db, tables)
    _replicated(cdc, tables)
    if lake:
        cdc.apply_local("lake")
    return cdc


def _check_key_lists(cdc, asked: dict[str, list[list]], targets: list[str], damaged: dict[str, list[int]]) -> dict:
    """Each key list dumped and applied to every target; then, rows ``damaged`` (by v) in the PostgreSQL
    target, ``verify --keys --repair`` of it on each: the failures, {what: why} (none: every row kept)."""
    bad = {}

    def compare(what):
        for t in targets:
            bad.update({f"{what} {n} on {t}": d.describe() for n in asked if not (d := cdc.compare(n, t)).equal})
    for n, keys in asked.items():
        cdc.dump_local(n, cdc.request(DumpSpec("keys", [f"{cdc.db}.{n}"], keys)))
    for t in targets:
        cdc.apply_local(t)
    compare("dump")
    for n, vs in damaged.items():
        rel = target_table_name(cdc.source.table_schema(f"{cdc.db}.{n}"))
        _target_sql(cdc, f'UPDATE "{rel}" SET v = -v - 1000 WHERE v IN ({", ".join(map(str, vs))})')
    for t in targets:
        with Background(cdc, target=t):
            for n, keys in asked.items():
                out = _verify(cdc, f"{cdc.db}.{n}", target=t, scope="keys", keys=keys, repair=True)
                if not (out["equal"] or out.get("repaired")) or (t == "tgt" and n in damaged and out["equal"]):
                    bad[f"verify {n} on {t}"] = str(out["tables"]) + str(out.get("repair"))
    compare("after repair")
    return bad


def _extra_repaired(cdc, n: str, values_sql: str, key: list) -> str:
    """A row the source lacks put in the target, verify --keys --repair of its key spelled otherwise: what failed."""
    table = f"{cdc.db}.{n}"
    rel = target_table_name(cdc.source.table_schema(table))
    _target_sql(cdc, f'INSERT INTO "{rel}" SELECT {values_sql}, _dblog_pos FROM "{rel}" LIMIT 1')
    with Background(cdc):
        out = _verify(cdc, table, scope="keys", keys=[key], repair=True)
    if out["tables"][table]["extra"] != 1 or not out.get("repaired"):
        return f"{key}: {out['tables'][table]} {out.get('repair')}"
    return "" if (d := cdc.compare(n)).equal else d.describe()


# -- MariaDB TIME(n) in composite keys ------------------------------------------------------------
def _parts(us: int) -> tuple[str, int, int, int, int]:
    a = abs(us)
    return ("-" if us < 0 else ""), a // 3_600_000_000, a // 60_000_000 % 60, a // 1_000_000 % 60, a % 1_000_000


def _time_text(us: int, fsp: int) -> str:
    sign, h, m, s, f = _parts(us)
    return f"{sign}{h:02d}:{m:02d}:{s:02d}" + (f".{f:06d}"[:fsp + 1] if fsp else "")


def _time_spelling(rng: random.Random, us: int) -> str:
    """Another text MariaDB reads as the TIME ``us`` (whole units of its column's precision)."""
    sign, h, m, s, f = _parts(us)
    frac = rng.choice([f".{f:06d}", f".{f:06d}".rstrip("0").rstrip(".") if f else ""] + ([".0", ""] if not f else []))
    styles = [f"{sign}{h:02d}:{m:02d}:{s:02d}{frac}", f"{sign}{h}:{m}:{s}{frac}"]
    styles += [f"{sign}{h // 24} {h % 24:02d}:{m:02d}:{s:02d}{frac}"] if h < 24 * 34 else []   # D HH:MM:SS
    return rng.choice(styles + ([f"{sign}{h:d}{m:02d}{s:02d}{frac}"] if h < 100 else []))   # HHMMSS


def _times(rng: random.Random, fsp: int, n: int) -> list[int]:
    """Distinct TIME(fsp) values: edges (0, +-838:59:59, 24 h, 25 h, +-1 unit) and random ones of both signs."""
    unit, top = 10 ** (6 - fsp), (838 * 3600 + 59 * 60 + 59) * 1_000_000
    out = {0, top, -top, DAY_US, 25 * 3_600_000_000, -unit, unit}
    while len(out) < n:
        out.add(rng.choice([1, -1]) * rng.randrange(0, top // unit) * unit)
    return sorted(out)


@MARIADB
def test_time_keys_in_composite_keys_asked_for_in_other_spellings(src_db, make_cdc):
    rng = random.Random(29)
    tables, asked, damaged, v = {}, {}, {}, 0
    for fsp, shape in ((0, "text"), (2, "int"), (5, "text"), (6, "int")):   # a: case-insensitive text, or int
        name, rows, keys = f"t{fsp}{shape}", [], []
        for us in _times(rng, fsp, 10):
            v += 1
            first = v if shape == "int" else rng.choice(["a", "B", "x y", "é"]) + str(v % 3)
            rows.append((first, _time_text(us, fsp), v))
            keys.append([first if shape == "int" else rng.choice([first.swapcase(), first + "  ", first.upper() + " "]),
                         _time_spelling(rng, us)])
        keys.append([-1 if shape == "int" else "zz", _time_spelling(rng, 7_000_000)])   # a key the table lacks
        first_ddl = "a INT" if shape == "int" else "a VARCHAR(8) COLLATE utf8mb4_general_ci"
        tables[name] = (f"{first_ddl}, k TIME({fsp}), v INT, PRIMARY KEY (a, k)",
                        [f"INSERT INTO {name} VALUES " + ", ".join(f"('{a}', '{k}', {x})" for a, k, x in rows)])
        asked[name], damaged[name] = keys, [rows[0][2], rows[-1][2]]
    cdc = _replicas(src_db, make_cdc, tables, lake=True)
    bad = _check_key_lists(cdc, asked, ["tgt", "lake"], damaged)
    assert not bad, bad


# -- PostgreSQL interval keys: months, days and signed fields, spelled in every style -------------------
def _iv_spelling(rng: random.Random, months: int, days: int, us: int) -> str:
    """Another text of the interval: the value moved between months, days and microseconds (a month is 30
    days, a day 24 hours), in units, H:M:S, ISO 8601 with designators or verbose (@ ... ago) style."""
    to_days, to_us = rng.randint(-2, 2), rng.randint(-2, 2)
    months, days, us = months - to_days, days + 30 * to_days - to_us, us + to_us * DAY_US
    sign, h, m, s, f = _parts(us)
    return rng.choice([f"{months} mons {days} days {us} microseconds",
                       f"P{months}M{days}DT{sign}{abs(us) // 1_000_000}.{f:06d}S",
                       f"{months} mons {days} days {sign}{h}:{m:02d}:{s:02d}.{f:06d}",
                       f"@ {-months} mons {-days} days {-us} microseconds ago"])


def _intervals(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
    """Interval values distinct by PostgreSQL's equality, as (months, days, microseconds)."""
    out = [(0, 0, 3_000_000), (0, 1, 0), (1, 0, 0), (0, -1, 7_200_000_000), (0, 0, -1)] + [
        (rng.randint(-14, 14), rng.randint(-40, 40), rng.choice([1, -1]) * rng.randrange(
            0, 40 * 3_600_000_000, rng.choice([1, 1000, 1_000_000]))) for _ in range(n - 5)]
    return list({(m * 30 + d) * DAY_US + u: (m, d, u) for m, d, u in reversed(out)}.values())


def _iv_literal(m: int, d: int, u: int) -> str:
    return f"{m} mons {d} days {u} microseconds"


@POSTGRES
def test_interval_keys_in_composite_keys_asked_for_in_other_spellings(src_db, make_cdc):
    rng = random.Random(2929)
    tables, asked, damaged = {}, {}, {}
    for name, ddl in (("ia", "a INT, k INTERVAL, v INT, PRIMARY KEY (a, k)"),
                      ("ki", "k INTERVAL, a TEXT, v INT, PRIMARY KEY (k, a)")):
        values = _intervals(rng, 14)
        rows = [((i % 3, iv) if name == "ia" else (iv, f"é{i % 2}"), i) for i, iv in enumerate(values)]
        tables[name] = (ddl, [f"INSERT INTO {name} VALUES " + ", ".join("({}, {})".format(", ".join(
            f"'{_iv_literal(*x)}'" if isinstance(x, tuple) else f"'{x}'" for x in k), v) for k, v in rows)])
        asked[name] = [[_iv_spelling(rng, *x) if isinstance(x, tuple) else x for x in k] for k, _ in rows]
        asked[name].append([9, "77 days"] if name == "ia" else ["P77D", "é0"])   # a key the table lacks
        damaged[name] = [0, 3, len(rows) - 1]
    cdc = _replicas(src_db, make_cdc, tables, lake=True)
    bad = _check_key_lists(cdc, asked, ["tgt", "lake"], damaged)
    assert not bad, bad
    assert not _extra_repaired(cdc, "ia", "5, '5 days', 99", [5, "120:00:00"])   # (an extra row, spelled otherwise)


def _flips(rows: list[tuple[int, tuple]]) -> list[tuple[str, tuple]]:
    """A writer changing each key's text (not its value), its value and back, deleting and re-inserting it."""
    ops = []
    for a, (m, d, u) in rows:
        one, other = _iv_literal(m, d, u), _iv_literal(m - 1, d + 30, u + DAY_US)
        ops += [("UPDATE w SET k = %s::interval WHERE a = %s AND k = %s::interval", (other, a, one)),
                ("UPDATE w SET v = v + 1 WHERE a = %s AND k = %s::interval", (a, one)),
                ("UPDATE w SET k = k + INTERVAL '1000 days' WHERE a = %s AND k = %s::interval", (a, one)),
                ("UPDATE w SET k = k - INTERVAL '24000 hours' WHERE a = %s AND k = %s::interval + "
                 "INTERVAL '1000 days'", (a, one)),
                ("DELETE FROM w WHERE a = %s AND k = %s::interval", (a, other)),
                ("INSERT INTO w VALUES (%s, %s::interval, 0)", (a, one))]
    return ops


@POSTGRES
def test_interval_keys_changing_text_under_key_list_dumps_and_verifications(src_db, make_cdc):
    rng = random.Random(29290)
    rows = [(i % 3, iv) for i, iv in enumerate(_intervals(rng, 12))]
    cdc = _replicas(src_db, make_cdc, {"w": ("a INT, k INTERVAL, v INT, PRIMARY KEY (a, k)", [
        "INSERT INTO w VALUES " + ", ".join(f"({a}, '{_iv_literal(*iv)}', {i})" for i, (a, iv) in enumerate(rows))])},
                    lake=True)
    table, moving = f"{cdc.db}.w", rows[::3]
    keys = [[a, _iv_spelling(rng, *iv)] for a, iv in rows] + [[1, "P1000D"]]
    reports = []
    for target in ("tgt", "lake"):
        with Background(cdc, _flips(moving), target=target) as bg:
            cdc.dump_local("w", cdc.request(DumpSpec("keys", [table], keys)))
            reports += [(target, _verify(cdc, table, target=target, chunk_size=3)["tables"][table]),
                        (target, _verify(cdc, table, target=target, scope="keys", keys=keys)["tables"][table])]
            assert bg.writes > 0
    cdc.drain()
    for target in ("tgt", "lake"):
        cdc.apply_local(target)
        cdc.assert_equal("w", target=target)
    wrong = [(t, str(r)) for t, r in reports if not r["equal"] or r["compared"] < len(rows) - 2 * len(moving)]
    assert not wrong, wrong


# -- other PostgreSQL keys with several texts: (key type, extension, held keys' SQL, SQL of another text of %s)
HELD = {
    "u": ("UUID", None, "md5(s::text)::uuid", "upper(%s)"),
    "tz": ("TIMESTAMPTZ", None, "TIMESTAMPTZ '2024-01-01 00:00:00.5+00' + s * INTERVAL '7 hours 1 second'",
           "to_char(%s::timestamptz AT TIME ZONE 'Asia/Kolkata', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') || '+05:30'"),
    "n": ("NUMERIC(12,4)", None, "(s / 4.0)::numeric", "(%s::numeric * 1.000)::text"),
    "by": ("BYTEA", None, "decode(md5(s::text), 'hex')", "%s"),
    "ci": ("public.citext", "citext", "'Key ' || s", "upper(%s)"),
    "mc": ("MACADDR", None, "('08:00:2b:01:02:' || lpad(to_hex(s), 2, '0'))::macaddr", "upper(replace(%s, ':', '-'))"),
    "tm": ("TIME", None, "TIME '00:00:00' + s * INTERVAL '1 hour 1.5 seconds'", "regexp_replace(%s, '^0', '')"),
    "cd": ("CIDR", None, "('10.' || s || '.0.0/16')::cidr", "regexp_replace(%s, '\\.0\\.0/16$', '/16')"),
}


def _pg_keys(cdc, src_db, tables: dict, rows: int, other_texts: bool) -> dict[str, list[list]]:
    """Each table's keys as the source prints them, or (``other_texts``) in the other spelling."""
    asked = {}
    with src_db.cursor() as cur:
        for n, (_, _, _, respell) in tables.items():
            cur.execute(f"SELECT k::text FROM {n} ORDER BY v")
            held = [r[0] for r in cur.fetchall()]
            if n == "by":   # (a bytea key as the engine takes it: 0x and hex, in either case)
                held = ["0x" + h[2:].upper() for h in held]
            elif other_texts:
                for i, h in enumerate(held):
                    cur.execute(f"SELECT {respell}", (h,))
                    held[i] = cur.fetchone()[0]
            asked[n] = [[h] for h in held[:rows]]
    return asked


def _pg_tables(src_db, tables: dict, rows: int) -> None:
    with src_db.cursor() as cur:
        for ext in {t[1] for t in tables.values() if t[1]}:
            cur.execute(f"CREATE EXTENSION IF NOT EXISTS {ext} SCHEMA public")
    series = src_db.series(rows)
    _create(src_db, {n: (f"k {ddl} PRIMARY KEY, v INT", [f"INSERT INTO {n} SELECT {held}, s FROM {series}"])
                     for n, (ddl, _, held, _) in tables.items()})


@POSTGRES
def test_text_keys_whose_equality_is_not_their_text_keep_their_rows(src_db, make_cdc):
    cdc = _replicas(src_db, make_cdc, HELD, lake=True, create=lambda db, t: _pg_tables(db, t, 12))
    asked = _pg_keys(cdc, src_db, HELD, 12, other_texts=True)
    bad = _check_key_lists(cdc, asked, ["tgt", "lake"], {n: [1, 5] for n in HELD})
    assert not bad, bad


# -- the product bugs found -------------------------------------------------------------------------


def _hosts(rng: random.Random, n: int) -> list[str]:
    """inet values as the source prints them (abbrev): IPv4 and IPv6 hosts, and networks of both."""
    out = {"10.0.0.1", "::1", "192.168.0.0/16"}
    while len(out) < n:
        out.add(str(rng.choice([lambda: ipaddress.IPv4Address(rng.getrandbits(32)),
                                lambda: ipaddress.IPv6Address(rng.getrandbits(128)),
                                lambda: ipaddress.IPv4Network((rng.getrandbits(32), rng.randint(8, 30)), strict=False),
                                lambda: ipaddress.IPv6Network((rng.getrandbits(128), 64), strict=False)])()))
    return sorted(out)


@POSTGRES
def test_inet_keys_keep_their_rows(src_db, make_cdc):
    rng = random.Random(292)
    hosts = _hosts(rng, 12)
    cdc = _replicas(src_db, make_cdc, {"h": ("k INET PRIMARY KEY, v INT", [
        "INSERT INTO h VALUES " + ", ".join(f"('{h}', {i})" for i, h in enumerate(hosts))])})
    # each key exactly as the source prints it, then in another of its texts (a host's /32 or /128)
    bad = _check_key_lists(cdc, {"h": [[h] for h in hosts]}, ["tgt"], {"h": [0, 1, 2]})
    bad |= _check_key_lists(cdc, {"h": [[h if "/" in h else str(ipaddress.ip_interface(h))
                                          if rng.random() < 0.5 else ipaddress.ip_address(h).exploded.upper()]
                                         for h in hosts]}, ["tgt"], {})
    bad["extra"] = _extra_repaired(cdc, "h", "'10.255.0.9', 99", ["10.255.0.9"])
    assert not any(bad.values()), bad


@POSTGRES
def test_interval_keys_with_a_precision_or_fields_keep_their_rows(src_db, make_cdc):
    rng = random.Random(2930)
    tables, asked = {}, {}
    for name, ddl in (("p3", "k INTERVAL(3), v INT, PRIMARY KEY (k)"), ("p0", "a INT, k INTERVAL(0), v INT, "
                      "PRIMARY KEY (a, k)"), ("ds", "k INTERVAL DAY TO SECOND, v INT, PRIMARY KEY (k)")):
        values = [(m, d, u - u % 1_000_000 if name == "p0" else u - u % 1000) for m, d, u in _intervals(rng, 10)]
        values = list(dict.fromkeys((m * 30 + d) * DAY_US + u for m, d, u in values))   # (distinct after rounding)
        first = "1, " if name == "p0" else ""
        tables[name] = (ddl, [f"INSERT INTO {name} VALUES " + ", ".join(
            f"({first}'{_iv_literal(0, 0, x)}', {i})" for i, x in enumerate(values))])
        asked[name] = [([1] if name == "p0" else []) + [_iv_spelling(rng, 0, x // DAY_US, x % DAY_US)] for x in values]
    cdc = _replicas(src_db, make_cdc, tables)
    bad = _check_key_lists(cdc, asked, ["tgt"], {n: [0, 4] for n in tables})
    bad["extra"] = _extra_repaired(cdc, "p3", "'5 days', 99", ["120:00:00"])
    assert not any(bad.values()), bad


NOT_TEXT = {   # (type, held keys' SQL, SQL giving another text of the key %s)
    "jb": ("JSONB", "jsonb_build_object('a', s / 4.0, 'b', ARRAY[s * 1.5])",
           r"regexp_replace(%s, '(\d+\.\d+)', '\10', 'g')"),
    "na": ("NUMERIC[]", "ARRAY[s / 4.0, s]", r"regexp_replace(%s, '(\d+\.\d+)', '\10', 'g')"),
    "fa": ("FLOAT8[]", "ARRAY[s / 2.0, -0.0::float8]", r"regexp_replace(%s, '-0([,}])', '0\1', 'g')"),
    "ia": ("INTERVAL[]", "ARRAY[s * INTERVAL '1 day', INTERVAL '1 hour']",
           "(SELECT array_agg(x - INTERVAL '1 day' + INTERVAL '24 hours') FROM unnest(%s::interval[]) x)::text"),
}


@POSTGRES
def test_keys_whose_equality_is_not_their_text_keep_their_rows(src_db, make_cdc):
    tables = {n: (t, None, held, respell) for n, (t, held, respell) in NOT_TEXT.items()}
    cdc = _replicas(src_db, make_cdc, tables, create=lambda db, t: _pg_tables(db, t, 8))
    asked = _pg_keys(cdc, src_db, tables, 8, other_texts=True)
    assert all(a != h for n in tables for a, h in zip(asked[n], _pg_keys(cdc, src_db, tables, 8, False)[n]))
    bad = _check_key_lists(cdc, asked, ["tgt"], {n: [2] for n in tables})
    assert not bad, bad


@POSTGRES
def test_a_repaired_table_beside_one_not_verified_is_not_reported_differing(src_db, make_cdc, monkeypatch):
    from airflow_provider_dblog.engine import verify_run
    from airflow_provider_dblog.operators.verify import DBLogVerificationFailed, raise_if_differs
    cdc = _replicas(src_db, make_cdc, {n: ("id INT PRIMARY KEY, v INT", [
        f"INSERT INTO {n} SELECT seq, seq FROM {src_db.series(20)}"]) for n in ("t", "u")})
    _target_sql(cdc, f'UPDATE "{target_table_name(cdc.source.table_schema(f"{cdc.db}.u"))}" SET v = -1 WHERE id = 4')
    read_past, alters = verify_run._read_past, []

    def t_altered_then_read(parts, target, schema, need, deadline, wait_s):
        if schema.name == "t":   # t changes shape before every read of it
            with src_db.cursor() as cur:
                cur.execute(f"ALTER TABLE t ADD COLUMN c{len(alters)} INT")
                cur.execute("UPDATE t SET v = v WHERE id = 1")
            alters.append(cdc.source.current_resume()[0])
            need = max(need, alters[-1])
        return read_past(parts, target, schema, need, deadline, wait_s)
    monkeypatch.setattr(verify_run, "_read_past", t_altered_then_read)
    with Background(cdc):
        out = verify_run.run_verify(cdc.cfg, "tgt", DumpSpec("all", []), repair=True, wait_s=60)
    u, t = f"{cdc.db}.u", f"{cdc.db}.t"
    assert out["tables"][t]["incomplete"] and out["repair"][u]["equal"], out
    cdc.assert_equal("u")
    with pytest.raises(DBLogVerificationFailed) as e:
        raise_if_differs(out)
    assert t in str(e.value) and u not in str(e.value), str(e.value)


@MARIADB
def test_extra_time_keys_the_source_reads_in_part_are_repaired(src_db, make_cdc):
    extras = {"t0": ["00:00:01.9", "2 days", "900:00:00"], "t6": ["1 day 02:00:00", "-1 days +05:00:00", "3 mons"]}
    cdc = _replicas(src_db, make_cdc, {n: (f"k TIME({n[1]}) PRIMARY KEY, v INT", [
        f"INSERT INTO {n} VALUES ('00:00:01', 1), ('-00:00:01', 2), ('838:59:59', 3)"]) for n in extras})
    for n, keys in extras.items():   # rows the source lacks, in the target
        rel = target_table_name(cdc.source.table_schema(f"{cdc.db}.{n}"))
        _target_sql(cdc, *(f"INSERT INTO \"{rel}\" SELECT '{k}'::interval, 99, _dblog_pos FROM \"{rel}\" LIMIT 1"
                           for k in keys))
    with Background(cdc):
        outs = {n: _verify(cdc, f"{cdc.db}.{n}", repair=True) for n in extras}
        after = {n: _verify(cdc, f"{cdc.db}.{n}")["tables"][f"{cdc.db}.{n}"] for n in extras}
    wrong = {n: (outs[n].get("repaired"), after[n]["keys"]["extra"]) for n in extras if not after[n]["equal"]}
    assert not wrong, wrong   # {table: (said repaired, extra rows left)}
