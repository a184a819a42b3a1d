"""Keys from a user, and keys of one value under several texts, as PostgreSQL itself sees
them (methods of PostgresSource, bound in source.py).

- ``canonical_keys``: a requested key in the text the source's reads print for it (the dump's
  select expression, column_types.read_expr: a uuid in any case, an inet with or without its
  /32), so it matches its row's text.
- ``equal_keys``: which requested keys the database's own ``=`` takes for a key the source has
  (jsonb {"a": 1.00} and {"a": 1.0}, numeric[] {1.50} and {1.5}: the text-typed key columns):
  PostgreSQL prints what was stored, so no text of theirs is canonical. (citext is a string
  column: a key in another case gets a delete that a target's text column matches to nothing.) A key-list dump asks before it
  takes a requested key for deleted (reconcile.py), whose delete would match the row by value.
"""
from __future__ import annotations

import json

import psycopg2

from ...errors import InvalidKeyError
from ...keys import encode_scalar
from ...schema import TableSchema
from .column_types import read_expr


def _text_columns(table: TableSchema) -> list[int]:
    return [i for i, c in enumerate(table.key_columns) if c.type.startswith("text:")]


def canonical_keys(source, table: TableSchema, keys: list[tuple]) -> list[tuple]:
    """``Source.canonical_keys`` of a PostgresSource."""
    cols = _text_columns(table)
    if not cols or not keys:
        return keys
    native = source.native_columns(table.qualified)
    out = [list(k) for k in keys]
    for i in cols:
        sql_type = table.key_columns[i].type[5:]   # checked against schema._TEXT_TYPE
        expr = read_expr(native[table.key[i]], f"v::{sql_type}")
        try:
            rows = source._query(f"SELECT {expr} FROM unnest(%s::text[]) WITH ORDINALITY AS u(v, n) ORDER BY n",
                                 ([k[i] for k in keys],))
        except psycopg2.DataError as e:
            raise InvalidKeyError(f"{table.qualified}.{table.key[i]} ({sql_type}): "
                                  f"{str(e).strip().splitlines()[0]}") from None
        for k, (v,) in zip(out, rows):
            k[i] = v
    return [tuple(k) for k in out]


def equal_keys(source, table: TableSchema, candidates: list[tuple], known: list[str]) -> set[int]:
    """The indexes of ``candidates`` (keys of logical values) equal, by the key columns' own
    ``=``, to one of ``known`` (key strings, keys.encode_key). Key columns of other than text
    types compare by their canonical encoding, which is exact for them."""
    cols = set(_text_columns(table))
    if not cols or not candidates or not known:
        return set()
    known = [table.decode_key(k) for k in known]
    n = len(table.key)

    def column(keys: list[tuple], j: int) -> list[str]:
        if j in cols:
            return [str(k[j]) for k in keys]
        return [json.dumps(encode_scalar(k[j], table.key_types[j])) for k in keys]
    a = ", ".join(f"a{j}" for j in range(n))
    b = ", ".join(f"b{j}" for j in range(n))
    arrays = ", ".join(["%s::text[]"] * n)
    same = " AND ".join(f"c.a{j}::{table.key_columns[j].type[5:]} = k.b{j}::{table.key_columns[j].type[5:]}"
                        if j in cols else f"c.a{j} = k.b{j}" for j in range(n))
    query = (f"SELECT DISTINCT c.i FROM unnest({arrays}) WITH ORDINALITY AS c({a}, i) "   # (a hash join)
             f"JOIN unnest({arrays}) AS k({b}) ON {same}")
    try:
        rows = source._query(query, [column(candidates, j) for j in range(n)] + [column(known, j) for j in range(n)])
    except psycopg2.DataError:
        return set()   # (a text the type cannot read: no key equals it)
    return {int(i) - 1 for (i,) in rows}
