"""The tail's view of its tables' shapes (engine/schema_history.py): the schema version
each is read with, taken at the tail's checkpoint, and each change the reader meets in
the log, recorded as a new version with the table's behaviour (engine/schema_evolution.py)
or quarantining the table (engine/quarantine.py). Nothing here imports Airflow.
"""
from __future__ import annotations

import logging

from .arrow_values import encode_row
from .config import DumpConfig
from .errors import SchemaChangedError, UnknownTableError
from .positions import Position
from .quarantine import quarantine_table
from .requests import DumpSpec, validate_spec
from .schema import TableSchema
from .schema_evolution import EVOLVE, FAIL, LENIENT, Evolution, added_with_values, renames, version_evolution
from .schema_history import DESCRIBED, as_stored, same_description, version_at
from .sources.base import SchemaChange, Source, TableTruncated
from .state import RedisState
from .store import EventStore

log = logging.getLogger(__name__)


class TableShapes:
    def __init__(self, source: Source, state: RedisState, store: EventStore, dump: DumpConfig):
        self.source, self.state, self.store, self.dump = source, state, store, dump
        # filled by take_at from the recorded versions: a table gone from the catalog since
        # (renamed away, dropped) is read with the shape it had, and stops only itself
        self.schemas: dict[str, TableSchema] = {}
        self.versions: dict[str, dict] = {}   # each table's schema version being read (as stored)
        self.dump_requests: list[dict] = []   # {"table", "request_id"}: dumps of tables new to the capture

    def take_at(self, checkpoint: Position) -> None:
        """Decode the log from ``checkpoint`` with each table's schema version that held
        there (engine/schema_history.py), not the catalog's, which may be past a change
        still ahead in the log; a table without one gets the catalog's, recorded there.

        A table added to the config (no version, while the tail has recorded others) is
        captured from the checkpoint on, and a full dump of it is requested for the rows it
        already holds (the dump's windows order them against its log events, as for any
        dump)."""
        listed = self.store.listing()   # (one listing for every table: 1,000 tables start as fast as 10)
        recorded = {t: self.store.schema_versions(t, listed.get(t, [])) for t in self.source.tables}
        captured_before = any(recorded.values())
        for t in self.source.tables:
            version = version_at(recorded[t], checkpoint)
            if version is None:
                if captured_before and not recorded[t]:
                    self._request_dump(t)   # first: a crash before the version asks again
                version = as_stored(self.source.describe_table(t))
                self.store.write_schema_version(t, checkpoint, version)
            else:
                version = self._recreated_at_start(t, checkpoint, version)
            self.schemas[t] = self.source.adopt_table(t, version)
            self.versions[t] = version

    def _recreated_at_start(self, t: str, checkpoint: Position, version: dict) -> dict:
        """The version to read ``t`` with from ``checkpoint``: the recorded one, unless the
        catalog's table under the name is another one (another oid: renamed away or dropped,
        and created again while the tail was stopped). The log cannot say where, so the table
        is quarantined from the checkpoint, read as the new table from there (the old one's
        rows are not its rows) and its full dump requested."""
        was = _oid(version)
        if not was:
            return version
        try:
            self.source.refresh_schema(t)   # the catalog's, not a shape adopted by an earlier session
        except UnknownTableError:
            # renamed away or dropped while the tail was stopped: no Relation may ever say so
            quarantine_table(self.state, t, checkpoint, f"{t} was not in the catalog when the tail started at "
                                                        f"{checkpoint} (renamed away or dropped while it was "
                                                        "stopped)")
            return version
        now = as_stored(self.source.describe_table(t))
        if _oid(now) in (None, 0, was):
            return version
        why = (f"{t} was re-created while the tail was stopped (another table under the name: oid {was} -> "
               f"{_oid(now)}); its changes are read from the tail's checkpoint {checkpoint} on")
        quarantine_table(self.state, t, checkpoint, why)
        version = now | {"behaviour": version.get("behaviour", EVOLVE), "renamed": [], "quarantined": why}
        self.store.write_schema_version(t, checkpoint, version)
        self._request_dump(t, "tail: the table was re-created")
        return version

    def _request_dump(self, t: str, by: str = "tail: a table new to the capture") -> None:
        spec = validate_spec(self.source, DumpSpec("table", [t]), self.dump)
        rid = self.state.create_request(spec.to_dict() | {"requested_by": by})
        self.dump_requests.append({"table": t, "request_id": rid})
        log.warning("tail %s: %s (%s): its changes are captured from here on, and dump request %s fetches the "
                    "rows it holds (run it: `dblog dump --request %s`, or the table's dump DAG)",
                    self.state.source, t, by.removeprefix("tail: "), rid, rid)

    def change(self, change: SchemaChange) -> None:
        """After the reader read a table's new shape (every event before it flushed or in
        parts): record it as a version from the change's position, with the table's
        behaviour and the columns renamed (engine/schema_evolution.py). A change its targets
        cannot follow quarantines the table (engine/quarantine.py); under the behaviour
        ``fail``, any change of its columns stops the tail."""
        t = change.table
        version, previous = as_stored(self.source.describe_table(t)), self.versions.get(t)
        if previous is not None and same_description(version, previous):
            return
        behaviour = self.source.config.schema_changes_for(t)
        renamed = renames(previous, version, change.renamed) if previous else []
        version = version | {"behaviour": behaviour, "renamed": [list(p) for p in renamed]} | (
            {"non_strict": True} if change.non_strict else {})
        if previous and behaviour in (EVOLVE, LENIENT):
            version |= self._fill_values(t, previous, version)
        ev = version_evolution(previous, version) if previous else Evolution(behaviour)
        if not ev.compatible and behaviour == FAIL:
            raise SchemaChangedError(
                f"{t} changed at {change.pos}: {ev.describe()}. The tail stops here; set the table's "
                f"schema_changes to evolve, lenient or ignore (the change then flows, or quarantines only "
                f"{t}), or undo the change, and start the tail again")
        recreated = previous is not None and _oid(previous) and _oid(version) and _oid(previous) != _oid(version)
        if recreated:
            # another table under the name (PostgreSQL: its oid): the rows it held are in no
            # event; a full dump of it, requested after the quarantine, releases it
            why = (f"re-created at {change.pos} (another table under the name: oid {_oid(previous)} -> "
                   f"{_oid(version)})")
            quarantine_table(self.state, t, change.pos, why)
            version = version | {"quarantined": why}
        elif not ev.compatible:
            # its targets stop before the change until a re-dump; the tail and the other
            # tables go on (engine/quarantine.py)
            quarantine_table(self.state, t, change.pos, f"changed at {change.pos}: {ev.describe()}")
            version = version | {"quarantined": ev.describe()}
        self.store.write_schema_version(t, change.pos, version)
        if recreated:
            self._request_dump(t, "tail: the table was re-created")
        self.schemas[t], self.versions[t] = self.source.table_schema(t), version
        if ev.compatible and not recreated:
            log.warning("tail %s: %s changed at %s (%s, schema_changes %s): its events are decoded with the "
                        "new shape from here, and the targets follow it", self.state.source, t, change.pos,
                        ev.describe(), behaviour)

    def truncated(self, item: TableTruncated) -> None:
        """A TRUNCATE of a table: recorded as a version of the same shape marked
        ``truncated``; its targets take it as a step (engine/schema_evolution.py). Under the
        behaviour ``fail`` the tail stops."""
        t = item.table
        behaviour = self.source.config.schema_changes_for(t)
        if behaviour == FAIL:
            raise SchemaChangedError(f"{t} was truncated at {item.pos}. The tail stops here; set the table's "
                                     "schema_changes to evolve (its targets are emptied there too), lenient or "
                                     "ignore (they keep their rows), and start the tail again")
        version = {k: self.versions[t][k] for k in DESCRIBED}
        version |= {"behaviour": behaviour, "renamed": [], "truncated": True, "truncated_ts": item.source_ts}
        self.store.write_schema_version(t, item.pos, version)
        self.versions[t] = version
        log.warning("tail %s: %s truncated at %s (schema_changes %s): %s", self.state.source, t, item.pos,
                    behaviour, "its targets are emptied there" if behaviour == EVOLVE else "its targets keep their rows")

    def _fill_values(self, t: str, previous: dict, version: dict) -> dict:
        """``{"fill": ...}``: the values the rows that existed before the change hold in the
        columns it added with a default, where the source can say (engine/schema_evolution.py);
        a column it cannot say for stays unfilled (the change then quarantines the table)."""
        new = TableSchema.from_dict(version["schema"])
        added = added_with_values(TableSchema.from_dict(previous["schema"]), new,
                                  (version.get("extra") or {}).get("defaults") or {}, version["renamed"])
        values, types = {}, {}
        for c in added:
            known, value = self.source.added_column_fill(t, c)
            if known:
                values[c], types[c] = value, new.column(c).type
            else:
                log.warning("tail %s: %s.%s was added, and the value its existing rows hold is not known: %s",
                            self.state.source, t, c, value)
        return {"fill": encode_row(types, values)} if values else {}



def _oid(version: dict) -> int | None:
    """The table's identity a version recorded (PostgreSQL's oid), or None."""
    return (version.get("extra") or {}).get("oid")
