"""Streaming replication client for pgoutput over psycopg 3's libpq layer."""

from producer.replication.client import ReplicationClient
from producer.replication.config import ReconnectPolicy, ReplicationConfig
from producer.replication.errors import ErrorKind, ReplicationError
from producer.replication.frames import Keepalive
from producer.replication.identifiers import TableName, quote_identifier, quote_literal
from producer.replication.setup import PublicationInfo, SlotInfo, SystemIdentity
from producer.replication.stream import Change, ReplicationStream

__all__ = [
    "Change",
    "ErrorKind",
    "Keepalive",
    "PublicationInfo",
    "ReconnectPolicy",
    "ReplicationClient",
    "ReplicationConfig",
    "ReplicationError",
    "ReplicationStream",
    "SlotInfo",
    "SystemIdentity",
    "TableName",
    "quote_identifier",
    "quote_literal",
]
