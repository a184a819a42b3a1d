"""engine/netting.py: a transaction under a DEFERRABLE primary key, as PostgreSQL logs it.

Hypothesis builds a table and a transaction of row operations on physical rows
(insert, update, key change, delete) during which two rows may share a key, as long as
every key is unique again at the commit. The events are emitted in the shape
sources/postgres/changes.py gives them (a key change is a delete of the old key and an insert of
the new one, each with full images), passed through the engine's ``net_changes``,
turned into the event log's Arrow form (``events_to_arrow``), reduced by the apply's own
``latest_per_key`` and applied to the old table: the result is the table at commit.
The control shows the un-netted events would lose rows.
"""
from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.apply_plan import latest_per_key
from airflow_provider_dblog.engine.events import DELETE, INSERT, UPDATE, Event, events_from_arrow, events_to_arrow
from airflow_provider_dblog.engine.netting import net_changes
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema

T = TableSchema("app", "t", (Column("id", "int32", False), Column("v", "string")), ("id",))
KEYS = st.integers(1, 5)


@st.composite
def transactions(draw):
    rows = {rid: {"id": k, "v": f"r{rid}"} for rid, k in enumerate(draw(st.sets(KEYS, max_size=4)))}
    before = {r["id"]: dict(r) for r in rows.values()}
    live = {rid: dict(r) for rid, r in rows.items()}
    events, next_rid = [], 100
    for step in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["insert", "update", "move", "delete"]))
        if kind == "insert" or not live:
            img = {"id": draw(KEYS), "v": f"n{step}"}
            live[next_rid] = img
            next_rid += 1
            events.append((INSERT, img["id"], None, dict(img)))
            continue
        rid = draw(st.sampled_from(sorted(live)))
        old = dict(live[rid])
        if kind == "update":
            new = {"id": old["id"], "v": f"u{step}"}
            events.append((UPDATE, old["id"], old, dict(new)))
            live[rid] = new
        elif kind == "move":
            new = {"id": draw(KEYS), "v": old["v"]}
            if new["id"] == old["id"]:
                continue
            events += [(DELETE, old["id"], old, None), (INSERT, new["id"], None, dict(new))]
            live[rid] = new
        else:
            events.append((DELETE, old["id"], old, None))
            del live[rid]
    after_keys = [r["id"] for r in live.values()]
    assume(len(after_keys) == len(set(after_keys)))     # the deferred check passes at commit
    final = {r["id"]: r for r in live.values()}
    log = [Event("app.t", op, (k,), b, a, Position(0, 0x1000, i), 0) for i, (op, k, b, a) in enumerate(events)]
    return before, log, final


def apply(table: dict, events: list[Event]) -> dict:
    """The apply's rule on the event log's own form: the latest event per key wins."""
    out = {k: dict(v) for k, v in table.items()}
    if not events:
        return out
    for e in events_from_arrow(T, latest_per_key(events_to_arrow(T, events))):
        if e.op == DELETE:
            out.pop(e.key[0], None)
        else:
            out[e.key[0]] = dict(e.after)
    return out


@settings(max_examples=400)
@given(transactions())
def test_netted_transaction_gives_the_table_at_commit(case):
    before, log, final = case
    netted = net_changes(log)
    assert len({e.key for e in netted}) == len(netted)          # one event per key
    assert all(e.pos.offset == 0x1000 for e in netted)          # at the transaction's position
    assert apply(before, netted) == final


def test_without_netting_a_key_swap_loses_a_row():
    """The control: ``UPDATE t SET id = 3 - id`` as the log gives it, applied as it is."""
    before = {1: {"id": 1, "v": "a"}, 2: {"id": 2, "v": "b"}}
    log = [Event("app.t", DELETE, (1,), {"id": 1, "v": "a"}, None, Position(0, 9, 0)),
           Event("app.t", INSERT, (2,), None, {"id": 2, "v": "a"}, Position(0, 9, 1)),
           Event("app.t", DELETE, (2,), {"id": 2, "v": "b"}, None, Position(0, 9, 2)),
           Event("app.t", INSERT, (1,), None, {"id": 1, "v": "b"}, Position(0, 9, 3))]
    final = {1: {"id": 1, "v": "b"}, 2: {"id": 2, "v": "a"}}
    assert apply(before, log) != final               # row 2 is gone
    assert apply(before, net_changes(log)) == final
