"""The torture run's load (tests/support/torture.py): money moved between accounts in two
tables and logged in a keyless third, with the invariant (torture_checks.invariant_violation)
holding at every transaction boundary."""

from __future__ import annotations

import random
import string
import threading
import time
from typing import Any

import psycopg
from psycopg import sql as pgsql

ACCOUNTS = 40  # per table at the opening
OPENING = 100_000  # cents per account
TOTAL = 2 * ACCOUNTS * OPENING
DOC_CHARS = 4_000  # over the TOAST threshold (~2 kB), stored EXTERNAL: always out of line


# -- the load ----------------------------------------------------------------------------------


class Workload:
    """Worker threads running pgbench-like transactions that keep the invariant."""

    def __init__(self, dsn: str, schema: str, seed: int, workers: int, pause_s: float) -> None:
        self.dsn = dsn
        self.schema = schema
        self.seed = seed
        self.workers = workers
        self.pause_s = pause_s
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.committed = 0
        self.retried = 0  # transactions rolled back or lost with the connection, then skipped
        self.notes: list[str] = []  # columns added during the run
        self.lock = threading.Lock()

    def ident(self, table: str) -> pgsql.Identifier:
        return pgsql.Identifier(self.schema, table)

    @property
    def tables(self) -> list[str]:
        return [f"{self.schema}.{t}" for t in ("checking", "savings", "history")]

    def create(self) -> None:
        s = pgsql.Identifier(self.schema)
        statements = [
            pgsql.SQL("CREATE SCHEMA {}").format(s),
            pgsql.SQL("CREATE SEQUENCE {} START 100000").format(self.ident("ids")),
            pgsql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, balance bigint NOT NULL, doc text)"
            ).format(self.ident("checking")),
            # EXTERNAL: out of line and uncompressed, so every doc is a TOAST pointer.
            pgsql.SQL("ALTER TABLE {} ALTER doc SET STORAGE EXTERNAL").format(
                self.ident("checking")
            ),
            pgsql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, balance bigint NOT NULL)").format(
                self.ident("savings")
            ),
            # No key: inserts only (a keyless table publishes no updates or deletes).
            pgsql.SQL(
                "CREATE TABLE {} (account text NOT NULL, delta bigint NOT NULL, at timestamptz)"
            ).format(self.ident("history")),
        ]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def open_accounts(self) -> None:
        """Opening balances, all in one transaction (before it, every table is empty)."""
        rnd = random.Random(self.seed)
        with psycopg.connect(self.dsn) as conn, conn.transaction():
            for i in range(ACCOUNTS):
                conn.execute(
                    pgsql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(self.ident("checking")),
                    (i, OPENING, doc(rnd)),
                )
                conn.execute(
                    pgsql.SQL("INSERT INTO {} VALUES (%s, %s)").format(self.ident("savings")),
                    (i, OPENING),
                )
                conn.execute(
                    pgsql.SQL("INSERT INTO {} VALUES (%s, %s, now())").format(
                        self.ident("history")
                    ),
                    (f"s{i}", OPENING),
                )

    def add_column(self) -> str:
        """ALTER TABLE checking ADD COLUMN note_<n> (nullable, no default: rows keep NULL on
        both sides until a later doc rewrite fills it)."""
        name = f"note_{len(self.notes) + 1}"
        for _ in range(600):  # PostgreSQL may be restarting after an earlier fault
            try:
                self._add_column(name)
                break
            except psycopg.OperationalError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"could not add column {name}: PostgreSQL unreachable for 300 s")
        with self.lock:
            self.notes.append(name)
        return name

    def _add_column(self, name: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                pgsql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} text").format(
                    self.ident("checking"), pgsql.Identifier(name)
                )
            )
            # One change that uses it at once: the producer needs the new schema registered.
            conn.execute(
                pgsql.SQL("UPDATE {} SET {} = 'added' WHERE id = (SELECT min(id) FROM {})").format(
                    self.ident("checking"), pgsql.Identifier(name), self.ident("checking")
                )
            )

    def start(self) -> None:
        self.stop_event.clear()
        self.threads = [
            threading.Thread(target=self._worker, args=(self.seed * 1000 + i,), daemon=True)
            for i in range(self.workers)
        ]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(120)

    def _worker(self, seed: int) -> None:
        rnd = random.Random(seed)
        conn: psycopg.Connection[Any] | None = None
        while not self.stop_event.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, connect_timeout=5)
                with conn.transaction():
                    self._one(conn, rnd)
                with self.lock:
                    self.committed += 1
            except (psycopg.OperationalError, psycopg.errors.AdminShutdown):
                # PostgreSQL went away (a crash fault): the outcome of an in-flight commit is
                # unknown and does not matter here (the invariant holds either way).
                with self.lock:
                    self.retried += 1
                if conn is not None:
                    conn.close()
                conn = None
                self.stop_event.wait(0.5)
                continue
            except _Skip:
                with self.lock:
                    self.retried += 1
            self.stop_event.wait(self.pause_s)
        if conn is not None:
            conn.close()

    def _pick(self, conn: psycopg.Connection[Any], table: str) -> int:
        """A random row, locked; SKIP LOCKED so workers never wait on each other (no deadlock)."""
        row = conn.execute(
            pgsql.SQL("SELECT id FROM {} ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED").format(
                self.ident(table)
            )
        ).fetchone()
        if row is None:
            raise _Skip()
        return int(row[0])

    def _log(self, conn: psycopg.Connection[Any], account: int, delta: int) -> None:
        conn.execute(
            pgsql.SQL("INSERT INTO {} VALUES (%s, %s, now())").format(self.ident("history")),
            (f"s{account}", delta),
        )

    def _add(self, conn: psycopg.Connection[Any], table: str, account: int, delta: int) -> None:
        cur = conn.execute(
            pgsql.SQL("UPDATE {} SET balance = balance + %s WHERE id = %s").format(
                self.ident(table)
            ),
            (delta, account),
        )
        if cur.rowcount != 1:
            raise _Skip()

    def _one(self, conn: psycopg.Connection[Any], rnd: random.Random) -> None:
        """One transaction of a random kind; checking rows are always locked first."""
        kind = rnd.choices(
            ["transfer", "renumber", "close", "open", "doc", "close_checking"],
            weights=[60, 10, 6, 6, 12, 6],
        )[0]
        c = self._pick(conn, "checking")
        if kind == "transfer":
            s = self._pick(conn, "savings")
            amount = rnd.randint(-5000, 5000)
            self._add(conn, "checking", c, -amount)
            self._add(conn, "savings", s, amount)
            self._log(conn, s, amount)
        elif kind == "renumber":  # key changes; the checking row's doc stays TOASTed, unchanged
            table = rnd.choice(["checking", "savings"])
            old = c if table == "checking" else self._pick(conn, "savings")
            conn.execute(
                pgsql.SQL("UPDATE {} SET id = nextval(%s) WHERE id = %s").format(self.ident(table)),
                (f"{self.schema}.ids", old),
            )
        elif kind == "close":  # a savings account closes into a checking account (a delete)
            s = self._pick(conn, "savings")
            row = conn.execute(
                pgsql.SQL("DELETE FROM {} WHERE id = %s RETURNING balance").format(
                    self.ident("savings")
                ),
                (s,),
            ).fetchone()
            assert row is not None
            self._add(conn, "checking", c, int(row[0]))
            self._log(conn, s, -int(row[0]))
        elif kind == "open":
            new = conn.execute(pgsql.SQL("SELECT nextval({})").format(pgsql.Literal(
                f"{self.schema}.ids"))).fetchone()  # fmt: skip
            assert new is not None
            amount = rnd.randint(1, 20_000)
            self._add(conn, "checking", c, -amount)
            conn.execute(
                pgsql.SQL("INSERT INTO {} VALUES (%s, %s)").format(self.ident("savings")),
                (new[0], amount),
            )
            self._log(conn, int(new[0]), amount)
        elif kind == "doc":  # a new TOASTed value (and the newest added column, when any)
            with self.lock:
                note = self.notes[-1] if self.notes else None
            sets: list[pgsql.Composable] = [pgsql.SQL("doc = %s")]
            params: list[Any] = [doc(rnd)]
            if note is not None:
                sets.append(pgsql.SQL("{} = %s").format(pgsql.Identifier(note)))
                params.append(f"n{rnd.randint(0, 999)}")
            conn.execute(
                pgsql.SQL("UPDATE {} SET {} WHERE id = %s").format(
                    self.ident("checking"), pgsql.SQL(", ").join(sets)
                ),
                (*params, c),
            )
        else:  # close_checking: a TOASTed row deleted, its money to another, a new one opened
            other = self._pick(conn, "checking")
            row = conn.execute(
                pgsql.SQL("DELETE FROM {} WHERE id = %s RETURNING balance").format(
                    self.ident("checking")
                ),
                (c,),
            ).fetchone()
            assert row is not None
            self._add(conn, "checking", other, int(row[0]))
            conn.execute(
                pgsql.SQL("INSERT INTO {} (id, balance, doc) VALUES (nextval(%s), 0, %s)").format(
                    self.ident("checking")
                ),
                (f"{self.schema}.ids", doc(rnd)),
            )


class _Skip(Exception):
    """Nothing to lock right now (another worker holds it): roll back, try another."""


def doc(rnd: random.Random) -> str:
    return "".join(rnd.choices(string.ascii_letters + string.digits, k=DOC_CHARS))
