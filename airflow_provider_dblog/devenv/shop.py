"""The demo's shop database on each source kind: create it, seed it server-side,
and the SQL of the application writes. Same tables, same shapes, the dialect's SQL.

Tables: ``shop.customers`` (DECIMAL, DATETIME/TIMESTAMP(6), JSON, BLOB/BYTEA,
NULLs), ``shop.orders``, ``shop.order_items`` (a composite key).
"""
from __future__ import annotations

import pymysql
import psycopg2
from psycopg2 import sql

from ..engine.config import SourceConfig

TABLES = ("shop.customers", "shop.orders", "shop.order_items")


def sizes_for(rows: int) -> dict[str, int]:
    n_cust, n_ord = max(1, rows // 5), max(1, rows * 7 // 20)
    return {"shop.customers": n_cust, "shop.orders": n_ord,
            "shop.order_items": max(1, rows - n_cust - n_ord)}


class _Shop:
    """What both dialects share: the config, and seeding by server-side generation
    (a million rows in seconds)."""

    def __init__(self, cfg: SourceConfig):
        self.cfg = cfg

    def connect(self, database: str | None = None):
        raise NotImplementedError

    def generate(self, cur, n_cust: int, n_ord: int, n_items: int) -> None:
        """Generate the rows of the three tables (customers, orders, order items)."""
        raise NotImplementedError

    def seed(self, rows: int) -> dict[str, int]:
        """About *rows* rows over the three tables; their counts by table."""
        sizes = sizes_for(rows)
        conn = self.connect()
        with conn.cursor() as cur:
            self.generate(cur, *(sizes[t] for t in TABLES))
        conn.close()
        return sizes


class MySQLShop(_Shop):
    """Database ``shop`` on MariaDB/MySQL."""
    integrity_errors = (pymysql.err.IntegrityError,)
    ddl = [
        """CREATE TABLE customers (id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL,
            email VARCHAR(128), balance DECIMAL(12,2) NOT NULL, created_at DATETIME(6) NOT NULL,
            profile JSON, avatar BLOB, note VARCHAR(255) NULL) ENGINE=InnoDB""",
        """CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id BIGINT NOT NULL,
            total DECIMAL(14,2) NOT NULL, status VARCHAR(16) NOT NULL,
            placed_at DATETIME(6) NOT NULL, meta JSON NULL) ENGINE=InnoDB""",
        """CREATE TABLE order_items (order_id BIGINT NOT NULL, line_no INT NOT NULL,
            sku VARCHAR(32) NOT NULL, qty INT NOT NULL, price DECIMAL(10,2) NOT NULL,
            PRIMARY KEY (order_id, line_no)) ENGINE=InnoDB""",
    ]
    # the application's writes (parameters in the same order for both dialects)
    upsert_item = ("INSERT INTO order_items VALUES (%s,%s,%s,%s,%s) "
                   "ON DUPLICATE KEY UPDATE qty = qty + 1")
    insert_customer = "INSERT INTO customers VALUES (%s,%s,%s,%s,NOW(6),%s,%s,%s)"
    update_customer = ("UPDATE customers SET balance = balance + 1.25, "
                       "note = IF(note IS NULL, 'touched', NULL), "
                       "profile = JSON_SET(COALESCE(profile, '{}'), '$.v', %s), "
                       "created_at = NOW(6) WHERE id = %s")
    insert_order = "INSERT INTO orders VALUES (%s,%s,%s,'new',NOW(6),NULL)"

    def connect(self, database: str | None = "shop"):
        e = self.cfg.endpoint
        return pymysql.connect(host=e.host, port=e.port, user=e.user, password=e.password,
                               database=database, autocommit=True)

    def reset(self) -> None:
        conn = self.connect(None)
        with conn.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS shop")
            cur.execute("CREATE DATABASE shop")
            cur.execute("USE shop")
            for ddl in self.ddl:
                cur.execute(ddl)
        conn.close()

    def generate(self, cur, n_cust: int, n_ord: int, n_items: int) -> None:
        """MariaDB's sequence engine."""
        cur.execute("SET SESSION sql_log_bin = 0")  # the seed is state, not history
        cur.execute(f"""INSERT INTO customers
            SELECT seq, CONCAT('customer ', seq), IF(seq % 7 = 0, NULL, CONCAT('c', seq, '@example.com')),
                   ROUND((seq % 100000) / 7, 2), TIMESTAMP('2024-01-01') + INTERVAL seq * 1.000001 SECOND,
                   IF(seq % 5 = 0, NULL, JSON_OBJECT('tier', seq % 4, 'tags', JSON_ARRAY('a', seq % 10))),
                   IF(seq % 3 = 0, NULL, UNHEX(MD5(seq))), NULL
            FROM seq_1_to_{n_cust}""")
        cur.execute(f"""INSERT INTO orders
            SELECT seq, 1 + (seq * 7919) % {n_cust}, ROUND((seq % 50000) / 3, 2),
                   ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'done'),
                   TIMESTAMP('2024-06-01') + INTERVAL seq * 2.000003 SECOND,
                   IF(seq % 2 = 0, JSON_OBJECT('channel', 'web', 'n', seq), NULL)
            FROM seq_1_to_{n_ord}""")
        cur.execute(f"""INSERT INTO order_items
            SELECT 1 + (seq - 1) DIV 3, 1 + (seq - 1) % 3, CONCAT('SKU-', seq % 997),
                   1 + seq % 5, ROUND((seq % 9999) / 10, 2)
            FROM seq_1_to_{n_items}""")


class PostgresShop(_Shop):
    """Schema ``shop`` in the source's database on PostgreSQL (REPLICA IDENTITY FULL)."""
    integrity_errors = (psycopg2.IntegrityError,)
    ddl = [
        """CREATE TABLE customers (id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL,
            email VARCHAR(128), balance NUMERIC(12,2) NOT NULL, created_at TIMESTAMP(6) NOT NULL,
            profile JSONB, avatar BYTEA, note VARCHAR(255) NULL)""",
        """CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id BIGINT NOT NULL,
            total NUMERIC(14,2) NOT NULL, status VARCHAR(16) NOT NULL,
            placed_at TIMESTAMP(6) NOT NULL, meta JSONB NULL)""",
        """CREATE TABLE order_items (order_id BIGINT NOT NULL, line_no INT NOT NULL,
            sku VARCHAR(32) NOT NULL, qty INT NOT NULL, price NUMERIC(10,2) NOT NULL,
            PRIMARY KEY (order_id, line_no))""",
    ]
    upsert_item = ("INSERT INTO order_items VALUES (%s,%s,%s,%s,%s) "
                   "ON CONFLICT (order_id, line_no) DO UPDATE SET qty = order_items.qty + 1")
    insert_customer = "INSERT INTO customers VALUES (%s,%s,%s,%s,clock_timestamp(),%s,%s,%s)"
    update_customer = ("UPDATE customers SET balance = balance + 1.25, "
                       "note = CASE WHEN note IS NULL THEN 'touched' END, "
                       "profile = jsonb_set(COALESCE(profile, '{}'), '{v}', to_jsonb(%s::int)), "
                       "created_at = clock_timestamp() WHERE id = %s")
    insert_order = "INSERT INTO orders VALUES (%s,%s,%s,'new',clock_timestamp(),NULL)"

    def connect(self, database: str | None = None):
        e = self.cfg.endpoint
        conn = psycopg2.connect(host=e.host, port=e.port, user=e.user, password=e.password or None,
                                dbname=database or e.database, options="-c search_path=shop")
        conn.autocommit = True
        return conn

    def reset(self) -> None:
        """A fresh database: its old replication slot goes first (a slot keeps it alive)."""
        db = self.cfg.endpoint.database
        conn = self.connect("postgres")
        with conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        "WHERE database = %s AND active_pid IS NOT NULL", (db,))
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE database = %s AND NOT active", (db,))
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
            cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        conn.close()
        conn = self.connect()
        with conn.cursor() as cur:
            cur.execute("CREATE SCHEMA shop")
            for ddl in self.ddl:
                cur.execute(ddl)
                name = ddl.split()[2]
                cur.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
        conn.close()

    def generate(self, cur, n_cust: int, n_ord: int, n_items: int) -> None:
        """generate_series, before the slot exists: state, not history."""
        cur.execute(f"""INSERT INTO customers
            SELECT seq, 'customer ' || seq,
                   CASE WHEN seq % 7 = 0 THEN NULL ELSE 'c' || seq || '@example.com' END,
                   ROUND((seq % 100000) / 7.0, 2),
                   TIMESTAMP '2024-01-01' + seq * INTERVAL '1.000001 second',
                   CASE WHEN seq % 5 = 0 THEN NULL ELSE jsonb_build_object(
                       'tier', seq % 4, 'tags', jsonb_build_array('a', seq % 10)) END,
                   CASE WHEN seq % 3 = 0 THEN NULL ELSE decode(md5(seq::text), 'hex') END, NULL
            FROM generate_series(1, {n_cust}::bigint) AS s(seq)""")
        cur.execute(f"""INSERT INTO orders
            SELECT seq, 1 + (seq * 7919) % {n_cust}, ROUND((seq % 50000) / 3.0, 2),
                   (ARRAY['new', 'paid', 'shipped', 'done'])[1 + seq % 4],
                   TIMESTAMP '2024-06-01' + seq * INTERVAL '2.000003 second',
                   CASE WHEN seq % 2 = 0 THEN jsonb_build_object('channel', 'web', 'n', seq) END
            FROM generate_series(1, {n_ord}::bigint) AS s(seq)""")
        cur.execute(f"""INSERT INTO order_items
            SELECT 1 + (seq - 1) / 3, 1 + (seq - 1) % 3, 'SKU-' || seq % 997,
                   1 + seq % 5, ROUND((seq % 9999) / 10.0, 2)
            FROM generate_series(1, {n_items}::bigint) AS s(seq)""")
        cur.execute("ANALYZE")


SHOPS = {"mysql": MySQLShop, "postgres": PostgresShop}
