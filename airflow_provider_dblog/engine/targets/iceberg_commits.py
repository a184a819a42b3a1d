"""Every commit this target makes to an Iceberg table is refused, not re-based, when the
table moved on since it was read.

PyIceberg (0.10 on) retries a commit the catalog refused (another writer committed first)
by rebuilding its snapshot on top of the new one. Our merge planned its rewrite, its
position guard and the applied position from the snapshot it read, so a rebuilt commit
applies a batch twice when two applies of one table race (a repair beside the scheduled
apply: test_verify_break5.py). With ``commit.retry.num-retries`` 0 the refused commit
raises CommitFailedException instead, and the step runs again from the table's new state
(its guard then finds the batch in)."""
from __future__ import annotations

from pyiceberg.exceptions import CommitFailedException

RETRIES = "commit.retry.num-retries"
NO_RETRY = {RETRIES: "0"}


def refusing_retries(t, reload):
    """``t`` with its property set (once, for a table made before it was): ``reload()`` loads it again."""
    for _ in range(5):
        if t.metadata.properties.get(RETRIES) == "0":
            return t
        try:
            return t.transaction().set_properties(NO_RETRY).commit_transaction()
        except CommitFailedException:   # another writer set it or committed meanwhile: look again
            t = reload()
    raise CommitFailedException(f"{t.name()}: could not set {RETRIES}=0 (the table keeps changing)")
