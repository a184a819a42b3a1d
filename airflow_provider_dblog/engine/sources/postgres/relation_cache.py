"""Relation messages remembered by oid, and the tuples of Insert / Update / Delete
turned into ``{column: value}`` dicts (values parsed by type OID, text_values.py).

A TOASTed column that an UPDATE did not touch is sent without its value; it comes
back as ``UNCHANGED_TOAST``, never as ``None``.

Generic pgoutput reading (the benchmark's bare loop uses it); the tail reads the
captured tables by their captured schema instead (row_images.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from .pgoutput_messages import AnyMessage, Delete, Insert, Relation, TupleData, Type, Update
from .text_values import convert


class _UnchangedToast:
    """A TOASTed column an UPDATE did not change: pgoutput does not send its value.
    The caller must keep the value it already has (never write NULL for it)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self):
        return (_UnchangedToast, ())

    def __bool__(self) -> bool:
        return False


UNCHANGED_TOAST = _UnchangedToast()


@dataclass(frozen=True)
class TupleChange:
    """An Insert / Update / Delete with its tuples as dicts.

    ``before``: the old row (FULL) or the old key (only key columns), or None when
    pgoutput sent neither (an UPDATE under DEFAULT identity that kept its key).
    ``after``: the new row (None for a delete)."""
    op: str                     # 'insert' | 'update' | 'delete'
    relation: Relation
    before: Optional[dict]
    after: Optional[dict]
    before_is_key_only: bool


@dataclass
class RelationCache:
    """Relation messages by oid (pgoutput sends one before a relation's first change
    in a session and again after its schema changes), and the tuple -> dict step."""

    relations: dict[int, Relation] = field(default_factory=dict)
    types: dict[int, Type] = field(default_factory=dict)

    def add(self, msg: AnyMessage) -> None:
        """Remember a Relation or Type message (anything else is ignored)."""
        if isinstance(msg, Relation):
            self.relations[msg.oid] = msg
        elif isinstance(msg, Type):
            self.types[msg.oid] = msg

    def relation(self, oid: int) -> Relation:
        try:
            return self.relations[oid]
        except KeyError:
            raise KeyError(f"no Relation message seen for relation oid {oid}") from None

    def to_dict(self, rel: Relation, tup: TupleData, key_only: bool = False) -> dict:
        if len(tup) != len(rel.columns):
            raise ValueError(f"tuple has {len(tup)} columns, relation {rel.namespace}."
                             f"{rel.name} has {len(rel.columns)}")
        out: dict = {}
        for col, (kind, raw) in zip(rel.columns, tup):
            if key_only and not col.is_key:
                continue
            if kind == "n":
                out[col.name] = None
            elif kind == "u":
                out[col.name] = UNCHANGED_TOAST
            elif kind == "t":
                out[col.name] = convert(col.type_oid, raw.decode("utf-8"))
            else:   # 'b': binary format (the 'binary' option); left to the caller
                out[col.name] = raw
        return out

    def tuple_change(self, msg: Union[Insert, Update, Delete]) -> TupleChange:
        rel = self.relation(msg.relation_oid)
        if isinstance(msg, Insert):
            return TupleChange("insert", rel, None, self.to_dict(rel, msg.new), False)
        before, key_only = None, False
        if msg.old is not None:
            before = self.to_dict(rel, msg.old)
        elif msg.key is not None:
            before, key_only = self.to_dict(rel, msg.key, key_only=True), True
        if isinstance(msg, Update):
            return TupleChange("update", rel, before, self.to_dict(rel, msg.new), key_only)
        return TupleChange("delete", rel, before, None, key_only)
