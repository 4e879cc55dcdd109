"""Structured JSON logs on stderr: one object per line, ``extra=`` fields included.

Values that look like a connection string have their password masked, so a DSN passed in
``extra`` by mistake does not leak (the replication client already logs redacted DSNs).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, Final

_STANDARD: Final = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}
_SECRETS: Final = (
    re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE),
    re.compile(r"(://[^:/@\s]*:)([^@\s]*)(@)"),
)


def mask_secrets(text: str) -> str:
    text = _SECRETS[0].sub(r"\1***", text)
    return _SECRETS[1].sub(r"\1***\3", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": mask_secrets(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = mask_secrets(value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exc"] = mask_secrets(self.formatException(record.exc_info))
        return json.dumps(entry, default=str, ensure_ascii=False)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # httpx logs every registry request at INFO; the registry module logs what matters.
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
